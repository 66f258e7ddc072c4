//! The heartbeat: every few seconds this worker writes its row on every
//! shard (`shardq_workers`): who it is, what it serves, and its cumulative
//! per-shard counters from [`Stats::shards`], so that operators see the live
//! fleet and its lock-miss rate without asking each process. Before each
//! beat it gives back, fenced, the running jobs of workers whose heartbeat
//! stopped (a killed worker's), so they run again within seconds instead of
//! waiting out their lease, and deletes those workers' rows; a worker that
//! stops deletes its own.
//!
//! One loop per shard, like maintenance: a shard that hangs delays only its
//! own heartbeat (each statement has the shard's deadline).

use super::per_shard::each_shard;
use super::rotation::jitter;
use super::worker_run::WorkerRun;
use crate::config::Config;
use crate::store::workers::{self, Heartbeat};
use crate::telemetry::Stats;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use crate::heartbeat::{HEARTBEAT_INTERVAL, HEARTBEAT_TTL};

/// Jobs of silent workers given back per beat and shard; a dead worker's
/// whole buffer comes back in a beat or two.
const RELEASE_BATCH: i64 = 5_000;

/// How long a stopping worker waits to delete its rows; an unreachable
/// shard keeps its row until it expires.
const GOODBYE_LIMIT: Duration = Duration::from_secs(2);

/// The heartbeat's settings, from [`Config`].
#[derive(Debug, Clone)]
pub(crate) struct HeartbeatConfig {
    /// The queues this worker serves (`worker.queues`).
    pub queues: Vec<String>,
    /// Host name of this machine.
    pub host: String,
}

impl HeartbeatConfig {
    pub(crate) fn new(config: &Config) -> Self {
        HeartbeatConfig {
            queues: config.worker.queues.clone(),
            host: host_name(),
        }
    }
}

fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Beats on every shard until `stop` is cancelled, then deletes this
/// worker's rows (within [`GOODBYE_LIMIT`]).
pub(crate) async fn run(
    config: HeartbeatConfig,
    run: Arc<WorkerRun>,
    started: Instant,
    stop: CancellationToken,
) {
    let config = Arc::new(config);
    each_shard(run.shards.len(), |index| {
        shard_loop(config.clone(), run.clone(), index, started, stop.clone())
    })
    .await;
}

async fn shard_loop(
    config: Arc<HeartbeatConfig>,
    run: Arc<WorkerRun>,
    index: usize,
    started: Instant,
    stop: CancellationToken,
) {
    let shard = run.shards.get(index);
    loop {
        let counters = counters_of(&run.stats, index);
        let beat = Heartbeat {
            worker_id: &run.owner,
            host: &config.host,
            pid: std::process::id() as i32,
            queues: &config.queues,
            running_for: started.elapsed(),
            counters,
        };
        let beat = async {
            // First, judged by this worker's previous beat: the silent ones.
            match workers::release_silent(shard, &run.owner, HEARTBEAT_TTL, RELEASE_BATCH).await {
                Ok(released) if released.jobs > 0 => {
                    tracing::info!(
                        shard = %shard.name,
                        jobs = released.jobs,
                        workers = released.workers,
                        "gave back the running jobs of workers whose heartbeat stopped"
                    );
                    run.stats.record_recovered(index, released.jobs);
                }
                Ok(_) => {}
                Err(err) => tracing::warn!(
                    shard = %shard.name,
                    error = %crate::error_chain::error_chain(&err),
                    "cannot give back the jobs of silent workers; tried again next beat"
                ),
            }
            workers::heartbeat(shard, &beat).await
        };
        // A beat on a shard that hangs must not hold the worker's shutdown.
        let result = tokio::select! {
            _ = stop.cancelled() => break,
            result = beat => result,
        };
        if let Err(err) = result {
            tracing::debug!(shard = %shard.name, error = %crate::error_chain::error_chain(&err), "heartbeat skipped");
        }
        let pause = jitter(
            &mut rand::thread_rng(),
            HEARTBEAT_INTERVAL * 4 / 5,
            HEARTBEAT_INTERVAL,
        );
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
    }
    let goodbye = tokio::time::timeout(GOODBYE_LIMIT, workers::remove(shard, &run.owner)).await;
    if !matches!(goodbye, Ok(Ok(()))) {
        tracing::debug!(shard = %shard.name, "worker row left to expire");
    }
}

fn counters_of(stats: &Stats, index: usize) -> crate::telemetry::ShardCountersSnapshot {
    stats.shards().get(index).copied().unwrap_or_default()
}
