//! What the benchmark programs share: `--name N` flags and one fresh local
//! shard to measure on.

use anyhow::{Context, Result};
use shardq::shards::ShardSet;
use shardq::Config;
use shardq_local::EphemeralServer;

/// The whole number after `name` in `args`, or `default` when absent.
pub fn flag(args: &[String], name: &str, default: usize) -> Result<usize> {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .context(format!("{name} needs a value"))?
            .parse()
            .context(format!("{name} must be a whole number")),
        None => Ok(default),
    }
}

/// A new PostgreSQL server with one migrated shard on it, configured with
/// `extra` (more TOML sections). The server stops when it is dropped.
pub async fn one_shard(extra: &str) -> Result<(EphemeralServer, Config, ShardSet)> {
    let one = shardq_harness::one_shard("bench", extra).await?;
    Ok((one.server, one.config, one.shards))
}
