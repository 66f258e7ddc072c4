//! The setup a result was measured on: the machine and every server's settings.

use super::cluster::Cluster;
use crate::procfs;
use anyhow::Result;
use serde::Serialize;

/// The settings of one server that matter to a queue benchmark.
const SETTINGS_SQL: &str = "SELECT current_setting('server_version'), \
    current_setting('shared_buffers'), current_setting('synchronous_commit'), \
    current_setting('fsync'), current_setting('max_connections')";

/// The machine.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Cores this process may use.
    pub cores: usize,
    /// Memory in MiB.
    pub mem_total_mib: f64,
    /// /proc/loadavg at the start (other work on the machine shows here).
    pub loadavg_start: String,
    /// /proc/loadavg at the end.
    pub loadavg_end: String,
}

impl Machine {
    /// Reads it now (the end load average is filled in later).
    pub fn probe() -> Machine {
        Machine {
            cores: procfs::cpus(),
            mem_total_mib: procfs::mem_total_mib().unwrap_or(0.0),
            loadavg_start: procfs::loadavg(),
            loadavg_end: String::new(),
        }
    }
}

/// One server.
#[derive(Debug, Clone, Serialize)]
pub struct Server {
    /// Shard name.
    pub shard: String,
    /// `server_version`.
    pub version: String,
    /// `shared_buffers`.
    pub shared_buffers: String,
    /// `synchronous_commit`.
    pub synchronous_commit: String,
    /// `fsync`.
    pub fsync: String,
    /// `max_connections`.
    pub max_connections: String,
}

/// Asks every shard of `cluster`.
pub async fn servers(cluster: &Cluster) -> Result<Vec<Server>> {
    let mut out = Vec::new();
    for shard in cluster.admin.all() {
        let row = shard
            .client()
            .await?
            .query_one(SETTINGS_SQL, &[])
            .await
            .map_err(|e| shard.query_error(e))?;
        out.push(Server {
            shard: shard.name.clone(),
            version: row.get(0),
            shared_buffers: row.get(1),
            synchronous_commit: row.get(2),
            fsync: row.get(3),
            max_connections: row.get(4),
        });
    }
    Ok(out)
}
