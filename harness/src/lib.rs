//! What the benchmarks, the chaos run and the integration tests share:
//! local PostgreSQL clusters in a temporary folder ([`cluster`]), processes
//! they start and stop ([`process`]), where the workspace's binaries are
//! ([`exe`]), the statement that empties the job tables ([`reset`]), the
//! shard list they configure ([`shard_list`]), and for the integration
//! tests fresh shards per test ([`test_shards`]), a real PgBouncer in front
//! of them ([`pgbouncer`]) and a second worker process ([`child_test`]).

pub mod child_test;
pub mod cluster;
pub mod exe;
pub mod lossy_proxy;
pub mod pgbouncer;
pub mod process;
pub mod shard_list;
pub mod test_shards;

pub use cluster::{LocalCluster, TempRoot};
pub use process::Proc;
pub use shard_list::ShardList;

use anyhow::{Context, Result};
use shardq::shards::Shard;

/// Empties the job tables (CASCADE: tables that reference them empty too).
/// `lock_timeout` is lifted for this one transaction: TRUNCATE must wait out
/// an autovacuum rather than fail.
pub const RESET_SQL: &str = "BEGIN; SET LOCAL lock_timeout = 0; \
    TRUNCATE workflow_status CASCADE; COMMIT";

/// Empties the job tables of `shard` with [`RESET_SQL`].
///
/// # Errors
///
/// When the shard cannot be reached or the statement fails.
pub async fn reset(shard: &Shard) -> Result<()> {
    let db = shard.client().await?;
    db.batch_execute(RESET_SQL)
        .await
        .map_err(|e| shard.query_error(e))
        .context("cannot empty the job tables")
}

/// One fresh PostgreSQL server with one migrated shard on it.
pub struct OneShard {
    /// The server; it stops when dropped.
    pub server: shardq_local::EphemeralServer,
    /// The configuration as TOML: the shard, then the `extra` sections.
    pub toml: String,
    /// The same, parsed.
    pub config: shardq::Config,
    /// Pools over the shard.
    pub shards: shardq::shards::ShardSet,
}

/// Starts a server on a free port and migrates one shard named `name` on
/// it, configured with `extra` (more TOML sections).
///
/// # Errors
///
/// When the server does not start, the config is invalid or the migration fails.
pub async fn one_shard(name: &str, extra: &str) -> Result<OneShard> {
    let server = shardq_local::EphemeralServer::start()
        .await
        .context("cannot start a PostgreSQL server")?;
    let toml = ShardList::default().shard(name, server.url()).toml(extra);
    // No SHARDQ_* environment here: the caller's own statements use the
    // defaults; only worker processes take the user's overrides.
    let config = shardq::Config::from_toml(&toml).context("the one shard's config is invalid")?;
    let shards = shardq::shards::ShardSet::connect(&config)?;
    shardq::migrate::migrate_all(&shards).await?;
    Ok(OneShard {
        server,
        toml,
        config,
        shards,
    })
}
