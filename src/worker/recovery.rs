//! Lease recovery: periodically returns jobs whose lease expired (their owner
//! crashed or hung) to the queue. Gated per shard by an advisory lock, so one
//! process at a time does it.

use super::{Pipeline, Stats};
use crate::dequeue;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Jobs recovered per statement; a crashed owner's whole buffer comes back in a few calls.
const RECOVERY_BATCH: i64 = 5_000;

/// Runs until shutdown.
pub(crate) async fn run(pipeline: Arc<Pipeline>, shutdown: CancellationToken) {
    let every = pipeline.config.worker.recovery_interval;
    loop {
        let pause = super::rotation::jitter(&mut rand::thread_rng(), every / 2, every);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        for shard in pipeline.shards.all() {
            match dequeue::recover_expired(shard, RECOVERY_BATCH).await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(shard = %shard.name, jobs = n, "recovered jobs with expired leases");
                    Stats::add(&pipeline.stats.recovered, n);
                }
                Err(err) => {
                    tracing::debug!(shard = %shard.name, error = %crate::error_chain(&err), "lease recovery skipped");
                }
            }
        }
    }
}
