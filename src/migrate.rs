//! Versioned schema migrations, applied to every shard.
//!
//! Each shard records applied versions in `shardq_migrations`. A run takes a
//! transaction-level advisory lock first, so two processes migrating at once
//! serialise: the second sees the first one's versions and applies nothing.
//! Every migration runs in the same transaction as its record.

use crate::shards::{Shard, ShardError, ShardSet};
use crate::sql;

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

/// All migrations this binary knows, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_init.sql",
        sql: include_str!("../migrations/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "0002_key_order.sql",
        sql: include_str!("../migrations/0002_key_order.sql"),
    },
    Migration {
        version: 3,
        name: "0003_lifecycle.sql",
        sql: include_str!("../migrations/0003_lifecycle.sql"),
    },
    Migration {
        version: 4,
        name: "0004_key_exclusion.sql",
        sql: include_str!("../migrations/0004_key_exclusion.sql"),
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
}

/// Applies every missing migration to every shard. Returns, per shard, the
/// versions applied by this call.
///
/// # Errors
///
/// The first shard that fails; shards before it stay migrated.
pub async fn migrate_all(shards: &ShardSet) -> Result<Vec<Vec<i32>>, MigrateError> {
    let mut applied = Vec::with_capacity(shards.len());
    for shard in shards.all() {
        applied.push(migrate_shard(shard).await?);
    }
    Ok(applied)
}

/// Applies missing migrations to one shard.
///
/// # Errors
///
/// [`MigrateError::Shard`] when the shard fails.
pub async fn migrate_shard(shard: &Shard) -> Result<Vec<i32>, MigrateError> {
    let mut client = shard.client().await?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| shard.query_error(e))?;
    tx.execute(sql::MIGRATION_LOCK, &[&sql::MIGRATION_LOCK_KEY])
        .await
        .map_err(|e| shard.query_error(e))?;
    tx.batch_execute(sql::MIGRATIONS_TABLE_CREATE)
        .await
        .map_err(|e| shard.query_error(e))?;
    let done: Vec<i32> = tx
        .query(sql::MIGRATIONS_APPLIED, &[])
        .await
        .map_err(|e| shard.query_error(e))?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut applied = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| !done.contains(&m.version)) {
        tx.batch_execute(m.sql)
            .await
            .map_err(|e| shard.query_error(e))?;
        tx.execute(sql::MIGRATION_RECORD, &[&m.version, &m.name])
            .await
            .map_err(|e| shard.query_error(e))?;
        applied.push(m.version);
    }
    tx.commit().await.map_err(|e| shard.query_error(e))?;
    Ok(applied)
}

/// Checks that every shard is at exactly this binary's schema version.
///
/// # Errors
///
/// Which shard is behind, ahead, unmigrated or unreachable.
pub async fn check_all(shards: &ShardSet) -> Result<(), MigrateError> {
    for shard in shards.all() {
        let client = shard.client().await?;
        let exists: bool = client
            .query_one(sql::MIGRATIONS_TABLE_EXISTS, &[])
            .await
            .map_err(|e| shard.query_error(e))?
            .get(0);
        let found: Option<i32> = if exists {
            client
                .query_one(sql::MIGRATION_CURRENT, &[])
                .await
                .map_err(|e| shard.query_error(e))?
                .get(0)
        } else {
            None
        };
        let needed = latest_version();
        match found {
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
    }
    Ok(())
}
