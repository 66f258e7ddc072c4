//! The leaser: keeps the leases of every job this process holds (buffered,
//! running, or waiting to be written) alive, one statement per shard, every
//! third of the lease. A process that dies stops extending, and its jobs are
//! recovered once their leases expire.

use super::Pipeline;
use crate::dequeue;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Extensions per lease period: a lease survives two failed extensions in a row.
const EXTENSIONS_PER_LEASE: u32 = 3;

/// Runs until `stop` is cancelled.
pub(crate) async fn run(pipeline: Arc<Pipeline>, stop: CancellationToken) {
    let lease = pipeline.config.worker.lease;
    let every = lease / EXTENSIONS_PER_LEASE;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        for shard in pipeline.shards.all() {
            if let Err(err) = dequeue::extend_leases(shard, &pipeline.owner, lease).await {
                tracing::warn!(shard = %shard.name, error = %crate::error_chain(&err), "lease extension failed");
            }
        }
    }
}
