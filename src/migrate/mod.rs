//! Versioned schema migrations, applied to every shard.
//!
//! Each shard records applied versions in `shardq_migrations`. Each
//! migration takes an advisory lock first, so two processes migrating at once
//! serialise: the second sees the first one's versions and applies nothing.
//! A migration runs in the same transaction as its record, unless it is a
//! no-transaction migration ([`no_transaction`]): those build indexes
//! `CONCURRENTLY` and validate constraints added `NOT VALID`, so the fleet
//! keeps claiming while they run.
//!
//! Each shard also records its place in the shard map (`shardq_shard_map`:
//! the shard count and its index, as `migrate` found them in the
//! configuration). Range routing moves keys when shards are added, removed or
//! reordered, so `migrate` and the start check refuse a configuration whose
//! shard list disagrees with the recorded map ([`MigrateError::ShardMap`]).

pub mod no_transaction;
mod wait;

pub use wait::migrate_all_within;

use crate::shards::{Shard, ShardError, ShardSet};
use crate::store::schema::{self, MigrationTx};

/// One migration file.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Version, ascending from 1.
    pub version: i32,
    /// File name.
    pub name: &'static str,
    /// SQL text.
    pub sql: &'static str,
}

impl Migration {
    /// Whether the migration runs in one transaction (no
    /// `-- shardq:no-transaction` first line).
    pub fn runs_in_transaction(&self) -> bool {
        self.sql.lines().next().map(str::trim) != Some(no_transaction::MARKER)
    }
}

/// All migrations this binary knows, in order. From version 6 on, a
/// migration must not hold a lock that stops the fleet while it scans or
/// builds: [`no_transaction::lint`] checks it (a test runs it on each).
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_init.sql",
        sql: include_str!("../../migrations/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "0002_key_order.sql",
        sql: include_str!("../../migrations/0002_key_order.sql"),
    },
    Migration {
        version: 3,
        name: "0003_lifecycle.sql",
        sql: include_str!("../../migrations/0003_lifecycle.sql"),
    },
    Migration {
        version: 4,
        name: "0004_key_exclusion.sql",
        sql: include_str!("../../migrations/0004_key_exclusion.sql"),
    },
    Migration {
        version: 5,
        name: "0005_shard_map.sql",
        sql: include_str!("../../migrations/0005_shard_map.sql"),
    },
    Migration {
        version: 6,
        name: "0006_queue_activity.sql",
        sql: include_str!("../../migrations/0006_queue_activity.sql"),
    },
    Migration {
        version: 7,
        name: "0007_pause.sql",
        sql: include_str!("../../migrations/0007_pause.sql"),
    },
    Migration {
        version: 8,
        name: "0008_schedules.sql",
        sql: include_str!("../../migrations/0008_schedules.sql"),
    },
    Migration {
        version: 9,
        name: "0009_workers.sql",
        sql: include_str!("../../migrations/0009_workers.sql"),
    },
    Migration {
        version: 10,
        name: "0010_fillfactor.sql",
        sql: include_str!("../../migrations/0010_fillfactor.sql"),
    },
    Migration {
        version: 11,
        name: "0011_claim_by_tid.sql",
        sql: include_str!("../../migrations/0011_claim_by_tid.sql"),
    },
    Migration {
        version: 12,
        name: "0012_claim_plans_once.sql",
        sql: include_str!("../../migrations/0012_claim_plans_once.sql"),
    },
    Migration {
        version: 13,
        name: "0013_primary_key_by_id.sql",
        sql: include_str!("../../migrations/0013_primary_key_by_id.sql"),
    },
    Migration {
        version: 14,
        name: "0014_complete_plans_once.sql",
        sql: include_str!("../../migrations/0014_complete_plans_once.sql"),
    },
    Migration {
        version: 15,
        name: "0015_backoff_capped.sql",
        sql: include_str!("../../migrations/0015_backoff_capped.sql"),
    },
    Migration {
        version: 16,
        name: "0016_retry_safe_writes.sql",
        sql: include_str!("../../migrations/0016_retry_safe_writes.sql"),
    },
];

/// The schema version this binary needs.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Errors from migrating or checking a shard.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The shard could not be reached or a statement failed.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// The shard was never migrated.
    #[error("shard `{shard}` has no shardq schema; run `shardq migrate`")]
    NotMigrated {
        /// Shard name.
        shard: String,
    },
    /// The shard's schema is older than this binary.
    #[error("shard `{shard}` is at schema version {found}, this binary needs {needed}; run `shardq migrate`")]
    Behind {
        /// Shard name.
        shard: String,
        /// Version found.
        found: i32,
        /// Version needed.
        needed: i32,
    },
    /// The shard's schema is newer than this binary.
    #[error("shard `{shard}` is at schema version {found}, newer than this binary's {needed}; upgrade shardq")]
    Ahead {
        /// Shard name.
        shard: String,
        /// Version found.
        found: i32,
        /// Version known.
        needed: i32,
    },
    /// The shard was migrated as another place in the shard map than the
    /// configuration gives it (shards added, removed or reordered).
    #[error(
        "shard `{shard}` was migrated as shard {recorded_index} of {recorded_count} \
         (counting from 0), but the configuration lists it as shard {configured_index} \
         of {configured_count}: adding, removing or reordering shards moves ordering \
         keys, deduplication and job lookups to other shards; restore the shard list \
         it was migrated with, or drain the queues and move to a fresh shard set \
         (README, 'Changing the shard list')"
    )]
    ShardMap {
        /// Shard name.
        shard: String,
        /// Shard count recorded on the shard.
        recorded_count: i32,
        /// Index recorded on the shard.
        recorded_index: i32,
        /// Shard count of the configuration.
        configured_count: i32,
        /// The shard's index in the configuration.
        configured_index: i32,
    },
    /// A no-transaction migration is due on a shard reached through a
    /// transaction pooler, which keeps no session (lock) between statements.
    #[error(
        "shard `{shard}`: migration {name} builds indexes concurrently, outside a \
         transaction, which needs one session; run `shardq migrate` with this shard's \
         URL pointing at the PostgreSQL server itself, not at the pooler"
    )]
    NeedsSession {
        /// Shard name.
        shard: String,
        /// The migration's file name.
        name: &'static str,
    },
    /// A statement of a no-transaction migration failed. Statements before it
    /// stay applied; each is written to be run again.
    #[error("shard `{shard}`: migration {name} failed at `{statement}`")]
    Statement {
        /// Shard name.
        shard: String,
        /// The migration's file name.
        name: &'static str,
        /// The statement, as written in the file.
        statement: String,
        /// The failure.
        #[source]
        source: Box<ShardError>,
    },
    /// The shard is at the current schema version but records no shard map.
    #[error("shard `{shard}` records no shard map; run `shardq migrate` with the full shard list")]
    ShardMapMissing {
        /// Shard name.
        shard: String,
    },
    /// [`migrate_all_within`]: a shard still refused connections when the
    /// wait ended.
    #[error(
        "a shard did not accept connections within {waited:?}: start its server, or check \
         its url (host, port), or wait longer"
    )]
    NotReady {
        /// How long it was waited for.
        waited: std::time::Duration,
        /// The last refusal.
        #[source]
        source: ShardError,
    },
}

/// The first migration whose transaction can record the shard map (it
/// creates `shardq_shard_map`).
const SHARD_MAP_SINCE: i32 = 5;

/// Applies every missing migration to every shard, and records each shard's
/// place in the shard map (its index among `shards.len()`) where none is
/// recorded yet. `shards` is the whole configured shard list. Returns, per
/// shard, the versions applied by this call.
///
/// Every shard's recorded place is checked against the list before any
/// shard is changed: a list that disagrees with one shard changes none
/// (migrating the shards before it would record the wrong list on them,
/// which would then refuse the right one).
///
/// # Errors
///
/// [`MigrateError::ShardMap`] (nothing applied on any shard) when a shard
/// records another place in the map; [`MigrateError::Shard`] (nothing
/// applied) when a shard cannot be reached for that check; otherwise the
/// first shard that fails, shards before it staying migrated.
///
/// # Cancel safety
///
/// Each migration is applied whole or not at all (a no-transaction one
/// statement by statement, each safe to run again): a dropped future leaves a
/// schema that the next call completes.
pub async fn migrate_all(shards: &ShardSet) -> Result<Vec<Vec<i32>>, MigrateError> {
    for shard in shards.all() {
        check_place(shard, shards.len()).await?;
    }
    let mut applied = Vec::with_capacity(shards.len());
    for shard in shards.all() {
        applied.push(migrate_shard(shard, shards.len()).await?);
    }
    Ok(applied)
}

/// Checks the place `shard` records in the shard map, if any, against the
/// configured one (index `shard.index` of `shard_count`). Reads only.
async fn check_place(shard: &Shard, shard_count: usize) -> Result<(), MigrateError> {
    let (count, index) = place(shard, shard_count);
    match schema::shard_map(shard).await? {
        Some(recorded) => compare_map(shard, recorded, Some(count), index),
        None => Ok(()),
    }
}

/// Applies missing migrations to one shard and records its place in the
/// shard map (index `shard.index` of `shard_count` shards) if none is
/// recorded: in the transaction of the migration that creates the map (or
/// of the first one applied after it), else in its own transaction at the end.
///
/// A migration runs in one transaction with its record, under the migration
/// lock, unless its file starts with `-- shardq:no-transaction`: then its
/// statements run one by one outside a transaction (`CREATE INDEX
/// CONCURRENTLY`, `VALIDATE CONSTRAINT`), so no table stays locked against
/// the fleet while an index builds ([`no_transaction`]).
///
/// # Errors
///
/// [`MigrateError::Shard`] when the shard fails (migrations before the failing
/// one stay applied); [`MigrateError::ShardMap`] (nothing applied) when the
/// shard records another place in the map; [`MigrateError::NeedsSession`]
/// when a no-transaction migration is due behind a transaction pooler.
///
/// # Cancel safety
///
/// Each migration is applied whole or not at all (a no-transaction one
/// statement by statement, each safe to run again): a dropped future leaves a
/// schema that the next call completes.
pub async fn migrate_shard(shard: &Shard, shard_count: usize) -> Result<Vec<i32>, MigrateError> {
    check_place(shard, shard_count).await?;
    let place = place(shard, shard_count);
    let mut applied = Vec::new();
    for m in MIGRATIONS {
        let newly = if m.runs_in_transaction() {
            apply_in_transaction(shard, m, place).await?
        } else {
            no_transaction::apply(shard, m).await?
        };
        if newly {
            applied.push(m.version);
        }
    }
    // Nothing was due (or only no-transaction migrations): the map of a
    // shard migrated before it existed is recorded here.
    let tx = MigrationTx::begin(shard).await?;
    match record_place(&tx, shard, place).await {
        Ok(()) => tx.commit().await?,
        Err(e) => {
            let _ = tx.rollback().await;
            return Err(e);
        }
    }
    Ok(applied)
}

/// In `tx` (which holds the migration lock): refuses a recorded place other
/// than `(count, index)`, records it where none is.
///
/// Under the lock no other `migrate` writes the map between the read and
/// the insert; a concurrent one with another list waits and is refused.
async fn record_place(
    tx: &MigrationTx<'_>,
    shard: &Shard,
    (count, index): (i32, i32),
) -> Result<(), MigrateError> {
    match tx.shard_map().await? {
        Some(recorded) => compare_map(shard, recorded, Some(count), index),
        None => Ok(tx.record_shard_map(count, index).await?),
    }
}

/// Applies `m` with its record in one transaction, under the migration lock,
/// unless it is applied already; from [`SHARD_MAP_SINCE`] on, the same
/// transaction checks or records the shard's place (`place`), so a shard's
/// schema and its map commit together. Returns whether this call applied it.
async fn apply_in_transaction(
    shard: &Shard,
    m: &Migration,
    place: (i32, i32),
) -> Result<bool, MigrateError> {
    let tx = MigrationTx::begin(shard).await?;
    // End the transaction on every path: one left open on a pooled
    // connection would hold the lock from the next try.
    let applied = match tx.applied().await {
        Ok(versions) => versions.contains(&m.version),
        Err(e) => {
            let _ = tx.rollback().await;
            return Err(e.into());
        }
    };
    if applied {
        tx.rollback().await?;
        return Ok(false);
    }
    let mut result = tx.apply(m.version, m.name, m.sql).await.map_err(Into::into);
    if result.is_ok() && m.version >= SHARD_MAP_SINCE {
        result = record_place(&tx, shard, place).await;
    }
    if let Err(e) = result {
        let _ = tx.rollback().await;
        return Err(e);
    }
    tx.commit().await?;
    Ok(true)
}

/// Checks that every shard is at exactly this binary's schema version and
/// records the place in the shard map that `shards` gives it.
///
/// `shards` is the whole configured shard list; to check one shard of it,
/// use [`check_shard`].
///
/// # Errors
///
/// Which shard is behind, ahead, unmigrated, unreachable, or in another
/// place of the shard map.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn check_all(shards: &ShardSet) -> Result<(), MigrateError> {
    for shard in shards.all() {
        check(shard, Some(shards.len())).await?;
    }
    Ok(())
}

/// Checks one shard of a list of `shard_count` shards, as [`check_all`].
///
/// # Errors
///
/// As [`check_all`].
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn check_shard(shard: &Shard, shard_count: usize) -> Result<(), MigrateError> {
    check(shard, Some(shard_count)).await
}

/// The schema version, then the shard map (the count only when known).
async fn check(shard: &Shard, shard_count: Option<usize>) -> Result<(), MigrateError> {
    let needed = latest_version();
    match schema::current_version(shard).await? {
        None => {
            return Err(MigrateError::NotMigrated {
                shard: shard.name.clone(),
            })
        }
        Some(v) if v < needed => {
            return Err(MigrateError::Behind {
                shard: shard.name.clone(),
                found: v,
                needed,
            })
        }
        Some(v) if v > needed => {
            return Err(MigrateError::Ahead {
                shard: shard.name.clone(),
                found: v,
                needed,
            })
        }
        Some(_) => {}
    }
    let recorded =
        schema::shard_map(shard)
            .await?
            .ok_or_else(|| MigrateError::ShardMapMissing {
                shard: shard.name.clone(),
            })?;
    let (count, index) = place(shard, shard_count.unwrap_or(1));
    compare_map(shard, recorded, shard_count.map(|_| count), index)
}

/// The shard's configured (count, index), as the map stores them.
fn place(shard: &Shard, shard_count: usize) -> (i32, i32) {
    let as_i32 = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    (as_i32(shard_count), as_i32(shard.index))
}

/// Compares the recorded (count, index) with the configured index and, when
/// known, the configured count.
fn compare_map(
    shard: &Shard,
    (recorded_count, recorded_index): (i32, i32),
    configured_count: Option<i32>,
    configured_index: i32,
) -> Result<(), MigrateError> {
    let count_differs = configured_count.is_some_and(|c| c != recorded_count);
    if count_differs || recorded_index != configured_index {
        return Err(MigrateError::ShardMap {
            shard: shard.name.clone(),
            recorded_count,
            recorded_index,
            configured_count: configured_count.unwrap_or(recorded_count),
            configured_index,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
