//! The leaser: keeps the leases of every job this process holds (buffered,
//! running, or waiting to be written) alive, one statement per shard, every
//! third of the lease. A process that dies stops extending, and its jobs are
//! recovered once their leases expire. It also asks each shard, every second,
//! which of the jobs this process holds were cancelled: a running handler is
//! told, an unstarted job is released (and written as cancelled) instead of run.

use super::Pipeline;
use crate::dequeue;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Extensions per lease period: a lease survives two failed extensions in a row.
const EXTENSIONS_PER_LEASE: u32 = 3;

/// How often running jobs are checked for cancellation: the longest a
/// cancelled handler keeps running unaware.
const CANCEL_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Runs until `stop` is cancelled.
pub(crate) async fn run(pipeline: Arc<Pipeline>, stop: CancellationToken) {
    let lease = pipeline.config.worker.lease;
    let extend_every = lease / EXTENSIONS_PER_LEASE;
    let mut last_extension = Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(CANCEL_POLL_INTERVAL.min(extend_every)) => {}
        }
        let extend = last_extension.elapsed() >= extend_every;
        if extend {
            last_extension = Instant::now();
        }
        // Shards in parallel: one slow shard must not delay the others' leases.
        let rounds = pipeline
            .shards
            .all()
            .iter()
            .map(|shard| upkeep_shard(&pipeline, shard, extend, lease));
        futures_util::future::join_all(rounds).await;
    }
}

/// Extends leases on one shard (when due) and passes on cancellations.
async fn upkeep_shard(
    pipeline: &Pipeline,
    shard: &crate::shards::Shard,
    extend: bool,
    lease: Duration,
) {
    if extend {
        if let Err(err) = dequeue::extend_leases(shard, &pipeline.owner, lease).await {
            tracing::warn!(shard = %shard.name, error = %crate::error_chain(&err), "lease extension failed");
        }
    }
    let held = pipeline.held_on(shard.index);
    if held.is_empty() {
        return;
    }
    match dequeue::cancel_requested(shard, &held).await {
        Ok(ids) => ids.into_iter().for_each(|id| pipeline.cancel_held(id)),
        Err(err) => {
            tracing::debug!(shard = %shard.name, error = %crate::error_chain(&err), "cancellation check failed")
        }
    }
}
