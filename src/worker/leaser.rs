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

use super::Pipeline;
use crate::dequeue;
use crate::shards::Shard;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Extensions per lease period: a lease survives two failed extensions in a row.
const EXTENSIONS_PER_LEASE: u32 = 3;

/// How often held jobs are checked for cancellation: the longest a cancelled
/// handler keeps running unaware.
const CANCEL_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Runs until `stop` is cancelled.
pub(crate) async fn run(pipeline: Arc<Pipeline>, stop: CancellationToken) {
    let mut loops = JoinSet::new();
    for index in 0..pipeline.shards.len() {
        loops.spawn(shard_loop(pipeline.clone(), index, stop.clone()));
    }
    while loops.join_next().await.is_some() {}
}

/// One shard's extensions and cancellation polls.
async fn shard_loop(pipeline: Arc<Pipeline>, index: usize, stop: CancellationToken) {
    let lease = pipeline.config.worker.lease;
    let extend_every = lease / EXTENSIONS_PER_LEASE;
    let shard = pipeline.shards.get(index).clone();
    let mut last_extension = Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(CANCEL_POLL_INTERVAL.min(extend_every)) => {}
        }
        let held = pipeline.held_on(index);
        if held.is_empty() {
            last_extension = Instant::now();
            continue;
        }
        if last_extension.elapsed() >= extend_every {
            last_extension = Instant::now();
            extend(&pipeline, &shard, &held, lease).await;
        }
        poll_cancellations(&pipeline, &shard, &held).await;
    }
}

async fn extend(
    pipeline: &Pipeline,
    shard: &Shard,
    held: &[(crate::job::JobId, i64)],
    lease: Duration,
) {
    if let Err(err) = dequeue::extend_leases(shard, &pipeline.owner, held, lease).await {
        tracing::warn!(shard = %shard.name, error = %crate::error_chain(&err), "lease extension failed");
    }
}

async fn poll_cancellations(pipeline: &Pipeline, shard: &Shard, held: &[(crate::job::JobId, i64)]) {
    let ids: Vec<crate::job::JobId> = held.iter().map(|(id, _)| *id).collect();
    match dequeue::cancel_requested(shard, &ids).await {
        Ok(ids) => ids.into_iter().for_each(|id| pipeline.cancel_held(id)),
        Err(err) => {
            tracing::debug!(shard = %shard.name, error = %crate::error_chain(&err), "cancellation check failed")
        }
    }
}
