//! Applying migrations and server-side functions to shards, recording and
//! checking each shard's place in the shard map, and the start check.

use super::error::MigrateError;
use super::functions;
use super::list::{latest_version, Migration, MIGRATIONS};
use super::no_transaction;
use crate::shards::{Shard, ShardSet};
use crate::store::schema::{self, MigrationTx};

/// The first migration whose transaction can record the shard map (it
/// creates `shardq_shard_map`).
const SHARD_MAP_SINCE: i32 = 5;

/// The first migration whose transaction can record the versioned map (it
/// creates `shardq_map_epochs` and `shardq_map_ranges`).
const MAP_EPOCHS_SINCE: i32 = 17;

/// Applies every missing migration to every shard, then the server-side
/// functions whose text changed (one file each in `migrations/functions/`), and records each shard's
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
/// The functions whose text differs from the recorded one are applied after
/// every migration: in the transaction of the last migration when it is due
/// and runs in one, else in that closing transaction; and in the
/// transaction of a migration marked `-- shardq:functions-with-this` (the
/// old functions cannot run after it).
///
/// A migration runs in one transaction with its record, under the migration
/// lock, unless its file starts with `-- shardq:no-transaction`: then its
/// statements run one by one outside a transaction (`CREATE INDEX
/// CONCURRENTLY`, `VALIDATE CONSTRAINT`), so no table stays locked against
/// the fleet while an index builds (a no-transaction migration).
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
    migrate(shard, shard_count, true).await
}

/// Migrates a shard that joins a list by `shardq reshard`: as
/// [`migrate_shard`], but no map epoch is recorded (the formula's epoch 1
/// over the new list would disagree with the current shards' map); the
/// reshard gives it the current shards' map. Until then map loaders pass
/// it over.
///
/// # Errors
///
/// As [`migrate_shard`].
///
/// # Cancel safety
///
/// As [`migrate_shard`].
pub async fn migrate_joining(shard: &Shard, shard_count: usize) -> Result<Vec<i32>, MigrateError> {
    migrate(shard, shard_count, false).await
}

async fn migrate(
    shard: &Shard,
    shard_count: usize,
    epoch_one: bool,
) -> Result<Vec<i32>, MigrateError> {
    check_place(shard, shard_count).await?;
    let place = place(shard, shard_count);
    let mut applied = Vec::new();
    for m in MIGRATIONS {
        let newly = if m.runs_in_transaction() {
            apply_in_transaction(shard, m, place, epoch_one).await?
        } else {
            no_transaction::apply(shard, m).await?
        };
        if newly {
            applied.push(m.version);
        }
    }
    // Nothing was due (or only no-transaction migrations): the map of a
    // shard migrated before it existed is recorded here, and functions whose
    // text changed are applied (when the last migration ran in a
    // transaction, that one applied them already: nothing is left to do).
    let tx = MigrationTx::begin(shard).await?;
    let closing = async {
        record_place(&tx, shard, place, true, epoch_one).await?;
        apply_functions(&tx, shard).await
    };
    match closing.await {
        Ok(()) => tx.commit().await?,
        Err(e) => {
            let _ = tx.rollback().await;
            return Err(e);
        }
    }
    Ok(applied)
}

/// In `tx` (which holds the migration lock): refuses a recorded place other
/// than `(count, index)`, records it where none is; then, once the map
/// tables exist (`map_tables`), records epoch 1 of the versioned map from
/// that place where no epoch is and `epoch_one` asks (the formula's
/// ranges: an upgraded shard routes as before; not for a shard joining by
/// `shardq reshard`) and refuses epochs whose ranges do not tile the keys.
///
/// Under the lock no other `migrate` writes the map between the read, the
/// inserts and the check; a concurrent one with another list waits and is
/// refused.
async fn record_place(
    tx: &MigrationTx<'_>,
    shard: &Shard,
    (count, index): (i32, i32),
    map_tables: bool,
    epoch_one: bool,
) -> Result<(), MigrateError> {
    match tx.shard_map().await? {
        Some(recorded) => compare_map(shard, recorded, Some(count), index)?,
        None => tx.record_shard_map(count, index).await?,
    }
    if !map_tables {
        return Ok(());
    }
    if epoch_one {
        tx.record_map_epoch_one().await?;
    }
    let epochs = tx.untiled_epochs().await?;
    if !epochs.is_empty() {
        return Err(MigrateError::MapNotTiled {
            shard: shard.name.clone(),
            epochs,
        });
    }
    Ok(())
}

/// Applies `m` with its record in one transaction, under the migration lock,
/// unless it is applied already; from [`SHARD_MAP_SINCE`] on, the same
/// transaction checks or records the shard's place (`place`), so a shard's
/// schema and its map commit together. Returns whether this call applied it.
async fn apply_in_transaction(
    shard: &Shard,
    m: &Migration,
    place: (i32, i32),
    epoch_one: bool,
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
        result = record_place(&tx, shard, place, m.version >= MAP_EPOCHS_SINCE, epoch_one).await;
    }
    // The last migration: every table is current, so the functions whose
    // text changed commit with it (no moment with new tables and old
    // functions, or the reverse). A migration the old functions cannot
    // run after applies them too (`applies_functions`).
    if result.is_ok() && (m.version == latest_version() || m.applies_functions()) {
        result = apply_functions(&tx, shard).await;
    }
    if let Err(e) = result {
        let _ = tx.rollback().await;
        return Err(e);
    }
    tx.commit().await?;
    Ok(true)
}

/// In `tx` (which holds the migration lock, after every migration of the
/// run): applies the functions whose text differs from the recorded one.
async fn apply_functions(tx: &MigrationTx<'_>, shard: &Shard) -> Result<(), MigrateError> {
    let applied = tx.apply_functions(&functions::pairs()).await?;
    if !applied.is_empty() {
        tracing::info!(shard = %shard.name, functions = ?applied, "applied server-side functions");
    }
    Ok(())
}

/// Checks that every shard is at exactly this binary's schema version, has
/// this binary's server-side functions, and records the place in the shard
/// map that `shards` gives it.
///
/// `shards` is the whole configured shard list.
///
/// # Errors
///
/// Which shard is behind, ahead, unmigrated, unreachable, in another place
/// of the shard map, or has other server-side functions.
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

/// The schema version, then the shard map (the count only when known) and
/// the tiling of its epochs' ranges, then the server-side functions.
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
    compare_map(shard, recorded, shard_count.map(|_| count), index)?;
    let epochs = crate::store::map::untiled_epochs(shard).await?;
    if !epochs.is_empty() {
        return Err(MigrateError::MapNotTiled {
            shard: shard.name.clone(),
            epochs,
        });
    }
    functions::check(shard).await
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
