//! Local PostgreSQL servers started from the system binaries, for development and tests.
//!
//! When running as root, initdb and postgres run as the `postgres` system user through
//! `runuser`. New data folders are copied from an initdb template kept in the temp folder.

mod binaries;
mod database;
mod datadir;
mod ephemeral;
mod error;
mod server;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use database::create_database;
pub use ephemeral::EphemeralServer;
pub use error::LocalError;
pub use server::{LocalServer, StopMode};

/// Options for a set of servers on consecutive ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalOptions {
    /// The folder holding one data folder per shard (`shard-{i}`).
    pub root: PathBuf,
    /// The port of shard 0; shard `i` listens on `base_port + i`.
    pub base_port: u16,
    /// How many servers.
    pub shards: usize,
}

/// The servers described by `opts`: shard `i` on `base_port + i`.
pub fn servers(opts: &LocalOptions) -> Vec<LocalServer> {
    (0..opts.shards)
        .map(|i| LocalServer::new(&opts.root, i, opts.base_port + i as u16))
        .collect()
}

/// Starts every server (those running are left alone) and creates their `shardq` database
/// if absent. Servers start in parallel.
///
/// # Errors
///
/// [`LocalError`]: binaries missing, `initdb` or a start failed, a port taken.
///
/// # Cancel safety
///
/// Not cancel safe: servers started before the drop keep running; calling
/// again is harmless (it starts only what is down).
pub async fn up(opts: &LocalOptions) -> Result<Vec<LocalServer>, LocalError> {
    let servers = servers(opts);
    let tasks: Vec<_> = servers
        .iter()
        .cloned()
        .map(|server| tokio::task::spawn_blocking(move || server.start()))
        .collect();
    // Wait for all before reporting, so no start keeps running behind our back.
    let mut first_error = None;
    for task in tasks {
        let result = task.await.map_err(LocalError::Task).and_then(|r| r);
        if let Err(e) = result {
            first_error.get_or_insert(e);
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    for server in &servers {
        create_database(&server.admin_url(), "shardq").await?;
    }
    Ok(servers)
}

/// Stops every server (fast mode); tries all and reports the first failure.
pub fn down(opts: &LocalOptions) -> Result<(), LocalError> {
    let mut first_error = None;
    for server in servers(opts) {
        if let Err(e) = server.stop(StopMode::Fast) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}
