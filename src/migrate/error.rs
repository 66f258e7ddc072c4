//! What can go wrong migrating or checking a shard.

use crate::shards::ShardError;

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
         of {configured_count}: configure the list it was migrated (or resharded) \
         with; to grow or shrink the list, run `shardq reshard --to NEW.toml` \
         (docs/operations.md, 'Changing the shard list')"
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
    /// The shard's server-side functions differ from this binary's (migrated
    /// by another shardq version, or never since functions were recorded).
    #[error(
        "shard `{shard}`: server-side functions {names:?} differ from this binary's; \
         run `shardq migrate` with this binary (or upgrade this binary when the shard \
         was migrated by a newer shardq)"
    )]
    FunctionsDiffer {
        /// Shard name.
        shard: String,
        /// The functions that differ.
        names: Vec<String>,
    },
    /// The shard is at the current schema version but records no shard map.
    #[error("shard `{shard}` records no shard map; run `shardq migrate` with the full shard list")]
    ShardMapMissing {
        /// Shard name.
        shard: String,
    },
    /// The shard records map epochs whose ranges do not tile the key space
    /// (written by hand, or by a broken tool).
    #[error(
        "shard `{shard}`: the ranges of map epoch(s) {epochs:?} do not tile the shard keys \
         0..65536 (a gap, an overlap or an unknown shard); fix shardq_map_ranges"
    )]
    MapNotTiled {
        /// Shard name.
        shard: String,
        /// The epochs at fault.
        epochs: Vec<i32>,
    },
    /// [`migrate_all_within`](super::migrate_all_within): a shard still
    /// refused connections when the wait ended.
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
