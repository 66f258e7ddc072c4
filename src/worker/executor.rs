//! Executor slots: each runs one handler at a time. Jobs with an ordering key
//! always reach the same slot (hash of the key), so they run in claim order
//! and never concurrently in this process; other jobs go to any free slot.

use super::context::JobContext;
use super::{HandlerRegistry, Shared};
use crate::config::Config;
use crate::job::{ClaimedJob, Completion, Outcome};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The executor slots' settings, from [`Config`].
#[derive(Debug, Clone)]
pub(crate) struct ExecutorConfig {
    /// Longest a handler may run (`worker.handler_timeout`).
    pub handler_timeout: Option<Duration>,
}

impl ExecutorConfig {
    pub fn new(config: &Config) -> Self {
        ExecutorConfig {
            handler_timeout: config.worker.handler_timeout,
        }
    }
}

/// What every executor slot uses.
pub(crate) struct Executor {
    pub config: ExecutorConfig,
    pub shared: Arc<Shared>,
    pub registry: Arc<HandlerRegistry>,
}

/// One slot's loop. Returns when `stop` is cancelled (after finishing the
/// job in hand) or when its inputs are closed and drained; hands back its own
/// queue so that the jobs still in it can be released.
///
/// A completion is handed on with a send that never waits in practice: the
/// channel holds as many as there are buffer credits (see `credits`).
pub(crate) async fn run_slot(
    executor: Arc<Executor>,
    mut own: mpsc::Receiver<ClaimedJob>,
    shared: async_channel::Receiver<ClaimedJob>,
    completions: mpsc::Sender<Completion>,
    stop: CancellationToken,
) -> mpsc::Receiver<ClaimedJob> {
    let mut held_back = HeldBack::default();
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
        executor.shared.stats.metrics.unbuffered(1);
        let completion = if held_back.holds(&job) {
            Completion::of(&job, Outcome::Released)
        } else {
            let key = job.ordering_key.clone().map(|k| (k, job.claim));
            let done = execute(&executor, job).await;
            if let (Some(key), Outcome::Failed(_)) = (key, &done.outcome) {
                held_back.failed(key);
            }
            done
        };
        if completions.send(completion).await.is_err() {
            return own;
        }
    }
}

/// Keys whose run failed in this slot: the rest of that run (the jobs of the
/// key that came in the same claim) is released unstarted, so the key's
/// later jobs wait behind the failed one's retry instead of overtaking it.
#[derive(Default)]
struct HeldBack {
    /// Key → the claim whose run failed.
    failed: HashMap<String, u64>,
}

/// More failed runs than this remembered at once means something is badly
/// wrong; forgetting them only risks running a failed run's tail.
const HELD_BACK_LIMIT: usize = 4096;

impl HeldBack {
    fn failed(&mut self, (key, claim): (String, u64)) {
        if self.failed.len() >= HELD_BACK_LIMIT {
            self.failed.clear();
        }
        self.failed.insert(key, claim);
    }

    /// Whether `job` belongs to a run that failed; forgets older runs of its key.
    fn holds(&mut self, job: &ClaimedJob) -> bool {
        let Some(key) = &job.ordering_key else {
            return false;
        };
        match self.failed.get(key) {
            Some(&claim) if claim == job.claim => true,
            Some(_) => {
                self.failed.remove(key);
                false
            }
            None => false,
        }
    }
}

/// Runs one job's handler and turns the result into a completion. While it
/// runs, the job's cancellation token is the one the leaser cancels; a job
/// whose cancellation was asked before it started is released instead (and
/// written as cancelled).
async fn execute(executor: &Executor, job: ClaimedJob) -> Completion {
    let shared = &executor.shared;
    let cancel = shared.running.cancel_token(job.id);
    if cancel.is_cancelled() {
        return Completion::of(&job, Outcome::Released);
    }
    if let Ok(waited) = std::time::SystemTime::now().duration_since(job.created_at) {
        shared
            .stats
            .metrics
            .record_pickup(job.shard, &job.queue, waited);
    }
    let mut done = Completion::of(&job, Outcome::Released);
    let ctx = JobContext {
        id: job.id,
        queue: job.queue,
        ordering_key: job.ordering_key,
        payload: job.payload,
        attempt: job.attempt,
        fence: job.fence,
        shard: shared.shards.get(job.shard).clone(),
        owner: shared.owner.clone(),
        cancel,
    };
    let running = &shared.stats.metrics.running;
    running.fetch_add(1, Relaxed);
    let result = run_with_timeout(executor, job.handler, ctx).await;
    running.fetch_sub(1, Relaxed);
    done.outcome = match result {
        Ok(output) => Outcome::Succeeded(output),
        Err(message) => {
            tracing::debug!(job = %done.id, error = %message, "job failed");
            Outcome::Failed(message)
        }
    }
    .storable();
    done.finished = std::time::Instant::now();
    done
}

/// Runs the handler as its own task, so that one that never returns can be
/// abandoned after `worker.handler_timeout`: its attempt fails (and is retried
/// like any failure) and the slot moves on. A task stuck without awaiting
/// cannot be stopped, only abandoned; it is counted.
async fn run_with_timeout(
    executor: &Executor,
    handler: String,
    ctx: JobContext,
) -> Result<serde_json::Value, String> {
    let registry = executor.registry.clone();
    let shard = ctx.shard.index;
    // The handler's own events carry the job: its id, queue, shard and attempt.
    let span = tracing::info_span!(
        "job",
        id = %ctx.id,
        queue = %ctx.queue,
        shard = %ctx.shard.name,
        attempt = ctx.attempt,
        handler = %handler,
    );
    let mut task = tokio::spawn(async move { registry.run(&handler, ctx).await }.instrument(span));
    let Some(limit) = executor.config.handler_timeout else {
        return task
            .await
            .unwrap_or_else(|e| Err(format!("handler task failed: {e}")));
    };
    match tokio::time::timeout(limit, &mut task).await {
        Ok(joined) => joined.unwrap_or_else(|e| Err(format!("handler task failed: {e}"))),
        Err(_) => {
            task.abort();
            super::Stats::add(&executor.shared.stats.abandoned, 1);
            executor.shared.stats.metrics.record_abandoned(shard);
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
