//! What a measured stretch costs: the servers' CPU (every process of every
//! shard's server, from the postmasters' accounting), this process's CPU
//! (the worker, and the bench around it), the transactions the servers
//! committed (`pg_stat_database.xact_commit`) and the top-level statements
//! they ran (pg_stat_statements, the observer's own left out).
//!
//! CPU is read when the stretch ends; the counters after the worker's pools
//! have closed, since a session sends its counts to the statistics only
//! now and then (at most once a second while busy) and at its exit.

use super::servers::{BenchShards, OBSERVER};
use crate::procfs::{self, Clock};
use anyhow::Result;
use serde::Serialize;
use std::time::Duration;

/// Time for the worker's sessions to exit (and send their counts) after
/// its pools close.
const SESSIONS_EXIT: Duration = Duration::from_millis(500);

/// The counters at a stretch's start.
pub struct Meter {
    clock: Clock,
    server_ticks: u64,
    own_ticks: u64,
    commits: i64,
}

/// A stretch's CPU, read at its end; the counters follow.
pub struct CpuTaken {
    clock: Clock,
    server_ticks: u64,
    own_ticks: u64,
    commits: i64,
}

/// What a stretch cost, per unit of work (a workflow, a message, a gather).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PerUnit {
    /// CPU of the PostgreSQL servers, µs.
    pub database_cpu_us: f64,
    /// CPU of this process (the worker, the client, the bench's polling), µs.
    pub worker_cpu_us: f64,
    /// Transactions the servers committed (each statement outside a
    /// transaction block is one; the observer's polls add a few per run).
    pub commits: f64,
    /// Top-level statements the servers ran, the observer's left out
    /// (`None` without pg_stat_statements).
    pub statements: Option<f64>,
}

impl Meter {
    /// Starts a stretch: forgets the statements counted so far.
    pub async fn start(shards: &BenchShards) -> Result<Meter> {
        if shards.counts_statements() {
            for shard in shards.observer().all() {
                let db = shard.client().await?;
                db.batch_execute(&format!("SELECT pg_stat_statements_reset() {OBSERVER}"))
                    .await?;
            }
        }
        Ok(Meter {
            clock: Clock::probe(),
            commits: commits(shards).await?,
            server_ticks: server_ticks(shards)?,
            own_ticks: procfs::stat("self")?.own(),
        })
    }

    /// Ends the stretch's CPU time.
    pub fn cpu(self, shards: &BenchShards) -> Result<CpuTaken> {
        Ok(CpuTaken {
            clock: self.clock,
            server_ticks: server_ticks(shards)?.saturating_sub(self.server_ticks),
            own_ticks: procfs::stat("self")?.own().saturating_sub(self.own_ticks),
            commits: self.commits,
        })
    }
}

impl CpuTaken {
    /// Reads the counters (call once the worker's pools are dropped) and
    /// divides everything by `units`.
    pub async fn per(self, shards: &BenchShards, units: usize) -> Result<PerUnit> {
        tokio::time::sleep(SESSIONS_EXIT).await;
        let n = units.max(1) as f64;
        let statements = match shards.counts_statements() {
            true => Some(statements(shards).await? as f64 / n),
            false => None,
        };
        Ok(PerUnit {
            database_cpu_us: self.clock.secs(self.server_ticks) * 1e6 / n,
            worker_cpu_us: self.clock.secs(self.own_ticks) * 1e6 / n,
            commits: (commits(shards).await? - self.commits) as f64 / n,
            statements,
        })
    }
}

fn server_ticks(shards: &BenchShards) -> Result<u64> {
    let mut ticks = 0;
    for &postmaster in shards.postmasters() {
        ticks += procfs::server_cpu_ticks(postmaster)?;
    }
    Ok(ticks)
}

async fn commits(shards: &BenchShards) -> Result<i64> {
    let sql = format!(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database() {OBSERVER}"
    );
    let mut total = 0;
    for shard in shards.observer().all() {
        let row = shard.client().await?.query_one(sql.as_str(), &[]).await?;
        total += row.get::<_, i64>(0);
    }
    Ok(total)
}

async fn statements(shards: &BenchShards) -> Result<i64> {
    let sql = format!(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements \
         WHERE toplevel AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND query NOT LIKE '%shardq-bench observer%' {OBSERVER}"
    );
    let mut total = 0;
    for shard in shards.observer().all() {
        let row = shard.client().await?.query_one(sql.as_str(), &[]).await?;
        total += row.get::<_, i64>(0);
    }
    Ok(total)
}
