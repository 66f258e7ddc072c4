//! Executor slots: each runs one handler at a time. Jobs with an ordering key
//! always reach the same slot (hash of the key), so they run in claim order
//! and never concurrently in this process; other jobs go to any free slot.

use super::context::JobContext;
use super::Pipeline;
use crate::job::{ClaimedJob, Completion, Outcome};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One slot's loop. Returns when `stop` is cancelled (after finishing the
/// job in hand) or when its inputs are closed and drained; hands back its own
/// queue so that the jobs still in it can be released.
pub(crate) async fn run_slot(
    mut own: mpsc::UnboundedReceiver<ClaimedJob>,
    shared: async_channel::Receiver<ClaimedJob>,
    pipeline: Arc<Pipeline>,
    completions: mpsc::UnboundedSender<Completion>,
    stop: CancellationToken,
) -> mpsc::UnboundedReceiver<ClaimedJob> {
    loop {
        // Biased: stop first, then keyed work, so a key's queue never waits
        // behind unkeyed jobs that other slots could take.
        let job = tokio::select! {
            biased;
            _ = stop.cancelled() => return own,
            Some(job) = own.recv() => job,
            Ok(job) = shared.recv() => job,
            else => return own,
        };
        let completion = execute(&pipeline, job).await;
        if completions.send(completion).is_err() {
            return own;
        }
    }
}

/// Runs one job's handler and turns the result into a completion. While it
/// runs, the job's cancellation token is findable by the leaser.
pub(crate) async fn execute(pipeline: &Pipeline, job: ClaimedJob) -> Completion {
    let cancel = CancellationToken::new();
    pipeline.running_insert(job.id, cancel.clone());
    if let Ok(waited) = std::time::SystemTime::now().duration_since(job.created_at) {
        pipeline.stats.metrics.record_pickup(waited);
    }
    let ctx = JobContext {
        id: job.id,
        queue: job.queue,
        ordering_key: job.ordering_key,
        payload: job.payload,
        attempt: job.attempt,
        shard: pipeline.shards.get(job.shard).clone(),
        owner: pipeline.owner.clone(),
        cancel,
    };
    let result = run_with_timeout(pipeline, job.handler, ctx).await;
    pipeline.running_remove(job.id);
    let outcome = match result {
        Ok(output) => Outcome::Succeeded(output),
        Err(message) => {
            tracing::debug!(job = %job.id, error = %message, "job failed");
            Outcome::Failed(message)
        }
    };
    Completion {
        id: job.id,
        shard: job.shard,
        attempt: job.attempt,
        outcome,
        finished: std::time::Instant::now(),
    }
}

/// Runs the handler as its own task, so that one that never returns can be
/// abandoned after `worker.handler_timeout`: its attempt fails (and is retried
/// like any failure) and the slot moves on. A task stuck without awaiting
/// cannot be stopped, only abandoned; it is counted.
async fn run_with_timeout(
    pipeline: &Pipeline,
    handler: String,
    ctx: JobContext,
) -> Result<serde_json::Value, String> {
    let registry = pipeline.registry.clone();
    let mut task = tokio::spawn(async move { registry.run(&handler, ctx).await });
    let Some(limit) = pipeline.config.worker.handler_timeout else {
        return task
            .await
            .unwrap_or_else(|e| Err(format!("handler task failed: {e}")));
    };
    match tokio::time::timeout(limit, &mut task).await {
        Ok(joined) => joined.unwrap_or_else(|e| Err(format!("handler task failed: {e}"))),
        Err(_) => {
            task.abort();
            super::Stats::add(&pipeline.stats.abandoned, 1);
            tracing::warn!(
                timeout_s = limit.as_secs_f64(),
                "handler timed out; abandoning it"
            );
            Err(format!(
                "handler timed out after {} ms and was abandoned (worker.handler_timeout_ms)",
                limit.as_millis()
            ))
        }
    }
}
