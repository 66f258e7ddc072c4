//! The maintenance loop: on every shard, recover jobs whose lease expired
//! and (less often) delete old finished jobs (due jobs are made ready by
//! the promoter, when they fall due). Each step is gated per shard, so across the fleet one
//! process at a time does it; the others' attempts cost one statement.
//! It also runs the cancel cascades owed (`store::cascades_owed`), each
//! taken by one process at a time through its row's lease.

use super::full_recovery::FullRecovery;
use super::per_shard::each_shard;
use crate::config::{Config, Retention};
use crate::shards::{Shard, ShardError, ShardSet};
use crate::store::{cascades_owed, upkeep};
use crate::telemetry::Stats;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Jobs recovered or promoted per statement; a crashed owner's whole buffer
/// comes back in a few passes.
const MAINTENANCE_BATCH: i64 = 5_000;

/// A pooled connection unused this long is closed (the pool reopens one when
/// load comes back).
const IDLE_CONNECTION: std::time::Duration = std::time::Duration::from_secs(60);

/// Owed cancel cascades taken per statement: each may take several round
/// trips to every shard, and all those taken must run within their lease.
const CASCADE_BATCH: i64 = 10;

/// Retention statements per shard and sweep, so a huge backlog is worked off
/// over several sweeps instead of holding the loop.
const MAX_RETENTION_ROUNDS: usize = 20;

/// The maintenance loop's settings, from [`Config`].
#[derive(Debug, Clone)]
pub(crate) struct MaintenanceConfig {
    /// Upkeep period per shard (`worker.maintenance_interval`).
    pub interval: std::time::Duration,
    /// Retention of finished jobs (`retention`).
    pub retention: Retention,
}

impl MaintenanceConfig {
    pub(crate) fn new(config: &Config) -> Self {
        MaintenanceConfig {
            interval: config.worker.maintenance_interval,
            retention: config.retention.clone(),
        }
    }
}

/// Runs until shutdown: one loop per shard, so a shard that hangs delays
/// only its own upkeep (each statement has a deadline).
pub(crate) async fn run(
    config: MaintenanceConfig,
    shards: ShardSet,
    stats: Arc<Stats>,
    shutdown: CancellationToken,
) {
    let config = Arc::new(config);
    each_shard(shards.len(), |index| {
        shard_loop(
            config.clone(),
            shards.clone(),
            stats.clone(),
            index,
            shutdown.clone(),
        )
    })
    .await;
}

async fn shard_loop(
    config: Arc<MaintenanceConfig>,
    shards: ShardSet,
    stats: Arc<Stats>,
    index: usize,
    shutdown: CancellationToken,
) {
    let every = config.interval;
    let retention = &config.retention;
    let shard = shards.get(index);
    let mut last_sweep = Instant::now();
    let mut recovery = FullRecovery::new();
    let mut cascades: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let pause = super::rotation::jitter(&mut rand::thread_rng(), every / 2, every);
        tokio::select! {
            _ = shutdown.cancelled() => {
                if let Some(task) = cascades {
                    task.abort();
                }
                return;
            }
            _ = tokio::time::sleep(pause) => {}
        }
        // In a task of its own, one at a time: a cascade waits on its
        // children's shards, which must not hold back this shard's upkeep.
        if cascades.as_ref().is_none_or(|task| task.is_finished()) {
            let shards = shards.clone();
            cascades = Some(tokio::spawn(async move {
                run_owed_cascades(&shards, index).await;
            }));
        }
        let sweep = last_sweep.elapsed() >= retention.interval;
        if sweep {
            last_sweep = Instant::now();
            shard.release_idle(IDLE_CONNECTION);
        }
        // Three duties, each on its own: one that fails (a deadline on a
        // stuck shard, say) is logged and the others still run.
        let start = recovery.start(Instant::now());
        match upkeep::recover(shard, MAINTENANCE_BATCH, start).await {
            Ok(pass) => {
                recovery.passed(start, &pass, Instant::now());
                recovered(shard, index, &stats, pass.recovered);
            }
            Err(err) => failed(shard, "lease recovery", &err),
        }
        if let Err(err) = upkeep::move_lease_floor(shard).await {
            failed(shard, "moving the lease floor", &err);
        }
        if sweep {
            if let Err(err) = sweep_finished(shard, retention).await {
                failed(shard, "retention", &err);
            }
            if let Err(err) = upkeep::forget_full_buckets(shard, MAINTENANCE_BATCH).await {
                failed(shard, "forgetting full group buckets", &err);
            }
            let sample = KEY_FLOORS_SAMPLE_PERCENT;
            if let Err(err) =
                upkeep::forget_quiet_key_floors(shard, MAINTENANCE_BATCH, sample).await
            {
                failed(shard, "forgetting quiet key floors", &err);
            }
        }
    }
}

/// The share of the key floors' pages each retention sweep reads for quiet
/// keys: every floor is looked at about once in a hundred sweeps.
const KEY_FLOORS_SAMPLE_PERCENT: f64 = 1.0;

/// Deletes finished jobs past retention with bounded statements, repeated
/// while they come back full.
async fn sweep_finished(shard: &Shard, retention: &Retention) -> Result<(), ShardError> {
    for _ in 0..MAX_RETENTION_ROUNDS {
        let deleted =
            upkeep::delete_finished(shard, retention.finished_after, retention.batch).await?;
        if deleted > 0 {
            tracing::info!(shard = %shard.name, deleted, "deleted finished jobs past retention");
        }
        if deleted < retention.batch as u64 {
            break;
        }
    }
    Ok(())
}

/// Runs the cancel cascades owed on shard `index` that are due
/// ([`cascades_owed::run_due`]: a batch at a time, for at most half of
/// the 30 s each taken cascade is leased for).
async fn run_owed_cascades(shards: &ShardSet, index: usize) {
    let shard = shards.get(index);
    match cascades_owed::run_due(shards, index, CASCADE_BATCH).await {
        Ok(pass) if pass.taken > 0 => {
            tracing::info!(shard = %shard.name, ?pass, "ran owed cancel cascades");
        }
        Ok(_) => {}
        Err(err) => failed(shard, "cancel cascades owed", &err),
    }
}

/// Logs and counts what a recovery pass returned to the queue.
fn recovered(shard: &Shard, index: usize, stats: &Stats, recovered: upkeep::Recovered) {
    if recovered != Default::default() {
        tracing::info!(shard = %shard.name, ?recovered, "recovered jobs with expired leases");
        stats.record_recovered(
            index,
            recovered.requeued + recovered.dead + recovered.cancelled,
        );
    }
}

/// A duty that failed on `shard` this pass: the next pass tries again.
pub(super) fn failed(shard: &Shard, duty: &str, err: &ShardError) {
    tracing::warn!(
        shard = %shard.name,
        duty,
        error = %crate::error_chain::error_chain(err),
        "maintenance duty failed; the others ran, it is tried again next pass"
    );
}
