//! Versioned schema migrations, applied to every shard.
//!
//! Each shard records applied versions in `shardq_migrations`. Each
//! migration takes an advisory lock first, so two processes migrating at once
//! serialise: the second sees the first one's versions and applies nothing.
//! A migration runs in the same transaction as its record, unless it is a
//! no-transaction migration (its first line says so): those build indexes
//! `CONCURRENTLY` and validate constraints added `NOT VALID`, so the fleet
//! keeps claiming while they run.
//!
//! Server-side functions are not in the numbered migrations: each has one
//! file with its current text, applied after the migrations of the run when
//! its text changed (one file each in `migrations/functions/`), and with a
//! migration the old functions cannot run after (its first line
//! `-- shardq:functions-with-this`). `migrations/schema.sql` is the schema a
//! migrated shard ends with (checked by a test).
//!
//! Each shard also records its place in the shard map (`shardq_shard_map`:
//! the shard count and its index, as `migrate` found them in the
//! configuration). Range routing moves keys when shards are added, removed or
//! reordered, so `migrate` and the start check refuse a configuration whose
//! shard list disagrees with the recorded map ([`MigrateError::ShardMap`]).

mod error;
pub(crate) mod functions;
#[cfg_attr(not(feature = "internal"), allow(unreachable_pub))]
mod list;
mod no_transaction;
#[cfg_attr(not(feature = "internal"), allow(dead_code, unreachable_pub))]
pub(crate) mod run;
mod wait;

pub use error::MigrateError;
pub use list::latest_version;
pub use run::{check_all, migrate_all};
pub use wait::migrate_all_within;

// Per shard and the migration list: operator tooling (`shardq reshard`, the
// tests), behind the `internal` feature (see `lib.rs`).
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use list::{Migration, MIGRATIONS};
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use run::{check_shard, migrate_joining, migrate_shard};

#[cfg(test)]
mod snapshot;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod upgrade_tests;
