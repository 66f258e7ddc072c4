//! The leaser: keeps the leases of every job this process holds (buffered,
//! running, or waiting to be written) alive, every third of the lease, and
//! asks, every second, which of them were cancelled: a running handler is
//! told, an unstarted job is released (and written as cancelled) instead of
//! run. Both go by the ids the process holds (primary-key probes), never by
//! walking the shard's running rows. A process that dies stops extending, and
//! its jobs are recovered once their leases expire.
//!
//! Each shard has its own loop: a shard that hangs delays only its own
//! statements (each has a deadline), never the leases on the others.

use super::per_shard::each_shard;
use super::worker_run::WorkerRun;
use crate::config::{Backoff, Config};
use crate::job::{Completion, Outcome};
use crate::shards::Shard;
use crate::store::jobs::{self, CompleteMany, ExtendLeases};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Extensions per lease period: a lease survives two failed extensions in a row.
const EXTENSIONS_PER_LEASE: u32 = 3;

/// How long, in statement deadlines after a claim lost its reply, the leaser
/// looks for jobs that claim left this process owning.
const ORPHAN_WINDOW_DEADLINES: u32 = 5;

/// How often held jobs are checked for cancellation: the longest a cancelled
/// handler keeps running unaware.
const CANCEL_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The leaser's settings, from [`Config`].
#[derive(Debug, Clone)]
pub(crate) struct LeaserConfig {
    /// Lease length (`worker.lease`).
    pub lease: Duration,
    /// Deadline of one statement (`dequeue.statement_timeout`).
    pub statement_timeout: Duration,
    /// Retry delays for the release of orphans (`worker.retry_backoff`).
    pub retry: Backoff,
}

impl LeaserConfig {
    pub fn new(config: &Config) -> Self {
        LeaserConfig {
            lease: config.worker.lease,
            statement_timeout: config.dequeue.statement_timeout,
            retry: config.worker.retry_backoff,
        }
    }
}

/// Runs until `stop` is cancelled.
pub(crate) async fn run(config: LeaserConfig, run: Arc<WorkerRun>, stop: CancellationToken) {
    let config = Arc::new(config);
    each_shard(run.shards.len(), |index| {
        shard_loop(config.clone(), run.clone(), index, stop.clone())
    })
    .await;
}

/// One shard's extensions and cancellation polls.
async fn shard_loop(
    config: Arc<LeaserConfig>,
    run: Arc<WorkerRun>,
    index: usize,
    stop: CancellationToken,
) {
    let lease = config.lease;
    let extend_every = lease / EXTENSIONS_PER_LEASE;
    let shard = run.shards.get(index).clone();
    let mut last_extension = Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(CANCEL_POLL_INTERVAL.min(extend_every)) => {}
        }
        release_orphans(&config, &run, &shard).await;
        let held = run.running.on(index);
        if held.is_empty() {
            last_extension = Instant::now();
            continue;
        }
        if last_extension.elapsed() >= extend_every {
            last_extension = Instant::now();
            extend(&run, &shard, &held, lease).await;
        }
        poll_cancellations(&run, &shard, &held).await;
    }
}

/// After a claim on this shard lost its reply (it may have run anyway), for
/// a few statement deadlines: gives back the running jobs this process owns
/// there but never received, at once instead of after their lease. Jobs
/// claimed less than two deadlines ago are left alone: the reply of such a
/// claim may still be on its way (the client waits a deadline plus a
/// quarter for the whole claim).
///
/// The jobs this process holds are read both before and after the shard is
/// asked: a job whose outcome is written (and forgotten) while the question
/// is out was seen running by it, yet is no orphan; the earlier read still
/// holds it.
async fn release_orphans(config: &LeaserConfig, run: &WorkerRun, shard: &Shard) {
    let deadline = config.statement_timeout;
    let Some(lost) = run.lost_claims.last(shard.index) else {
        return;
    };
    if lost.elapsed() > deadline * ORPHAN_WINDOW_DEADLINES {
        return;
    }
    let mut held = run.running.ids_on(shard.index);
    let owned = match jobs::owned_running(shard, &run.owner, deadline * 2).await {
        Ok(owned) => owned,
        Err(err) => {
            tracing::debug!(shard = %shard.name, error = %crate::error_chain::error_chain(&err), "orphan check failed");
            return;
        }
    };
    held.extend(run.running.ids_on(shard.index));
    let orphans: Vec<Completion> = owned
        .into_iter()
        .filter(|o| !held.contains(&o.id))
        .map(|o| Completion {
            id: o.id,
            shard: shard.index,
            fence: o.fence,
            keyed: o.keyed,
            outcome: Outcome::Released,
            finished: Instant::now(),
        })
        .collect();
    if orphans.is_empty() {
        return;
    }
    let release = CompleteMany {
        owner: &run.owner,
        retry: config.retry,
        done: &orphans,
    };
    match jobs::complete_many(shard, release).await {
        Ok(written) => {
            run.stats.record_written(shard.index, &written, []);
            tracing::info!(shard = %shard.name, released = written.released, "gave back jobs a lost claim reply left this process owning");
        }
        Err(err) => {
            tracing::debug!(shard = %shard.name, error = %crate::error_chain::error_chain(&err), "orphan release failed")
        }
    }
}

async fn extend(
    run: &WorkerRun,
    shard: &Shard,
    held: &[(crate::job::JobId, i64)],
    lease: Duration,
) {
    let extension = ExtendLeases {
        owner: &run.owner,
        held,
        lease,
    };
    if let Err(err) = jobs::extend_leases(shard, extension).await {
        tracing::warn!(shard = %shard.name, error = %crate::error_chain::error_chain(&err), "lease extension failed");
    }
}

async fn poll_cancellations(run: &WorkerRun, shard: &Shard, held: &[(crate::job::JobId, i64)]) {
    let ids: Vec<crate::job::JobId> = held.iter().map(|(id, _)| *id).collect();
    match jobs::cancel_requested(shard, &ids).await {
        Ok(ids) => ids.into_iter().for_each(|id| run.running.cancel(id)),
        Err(err) => {
            tracing::debug!(shard = %shard.name, error = %crate::error_chain::error_chain(&err), "cancellation check failed")
        }
    }
}
