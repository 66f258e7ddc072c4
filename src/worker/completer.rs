//! The completer: gathers outcomes per shard and writes each shard's batch in
//! one fenced statement, when it reaches the size threshold or when the flush
//! timer fires, whichever is first.

use super::{Pipeline, Stats};
use crate::dequeue;
use crate::job::Completion;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Completion writes in flight at once, over all shards: enough to overlap
/// shards, few enough not to compete with claims for connections.
const MAX_WRITES_IN_FLIGHT: usize = 4;

/// Longest pause between retries of a failed write.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

/// Runs until `input` closes, then flushes everything and waits for the
/// writes. `abandon` cancels writes still retrying (their jobs come back by
/// lease expiry).
pub(crate) async fn run(
    pipeline: Arc<Pipeline>,
    mut input: mpsc::UnboundedReceiver<Completion>,
    abandon: CancellationToken,
) {
    let batch = pipeline.config.worker.completion_batch;
    let mut pending: Vec<Vec<Completion>> = vec![Vec::new(); pipeline.shards.len()];
    let writes = Arc::new(Semaphore::new(MAX_WRITES_IN_FLIGHT));
    let mut tasks = JoinSet::new();
    let flush_every = pipeline
        .config
        .worker
        .completion_flush
        .max(Duration::from_millis(1));
    let mut tick = tokio::time::interval(flush_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            received = input.recv() => match received {
                Some(done) => {
                    let shard = done.shard;
                    pending[shard].push(done);
                    if pending[shard].len() >= batch {
                        let part = std::mem::take(&mut pending[shard]);
                        spawn_write(&mut tasks, &writes, &pipeline, shard, part, &abandon).await;
                    }
                }
                None => break,
            },
            _ = tick.tick() => {
                for (shard, waiting) in pending.iter_mut().enumerate() {
                    if !waiting.is_empty() {
                        let part = std::mem::take(waiting);
                        spawn_write(&mut tasks, &writes, &pipeline, shard, part, &abandon).await;
                    }
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    for (shard, waiting) in pending.iter_mut().enumerate() {
        if !waiting.is_empty() {
            let part = std::mem::take(waiting);
            spawn_write(&mut tasks, &writes, &pipeline, shard, part, &abandon).await;
        }
    }
    while tasks.join_next().await.is_some() {}
}

async fn spawn_write(
    tasks: &mut JoinSet<()>,
    writes: &Arc<Semaphore>,
    pipeline: &Arc<Pipeline>,
    shard: usize,
    part: Vec<Completion>,
    abandon: &CancellationToken,
) {
    let Ok(permit) = writes.clone().acquire_owned().await else {
        return;
    };
    let pipeline = pipeline.clone();
    let abandon = abandon.clone();
    tasks.spawn(async move {
        write_with_retry(&pipeline, shard, &part, &abandon).await;
        // The jobs are finished (or given up): make room for new claims.
        pipeline.room.add_permits(part.len());
        drop(permit);
    });
}

/// Writes one shard's batch, retrying with backoff while the shard is down.
async fn write_with_retry(
    pipeline: &Pipeline,
    shard_index: usize,
    part: &[Completion],
    abandon: &CancellationToken,
) {
    let shard = pipeline.shards.get(shard_index);
    let stats = &pipeline.stats;
    let mut delay = Duration::from_millis(50);
    loop {
        match dequeue::complete_many(shard, &pipeline.owner, part).await {
            Ok(written) => {
                Stats::add(&stats.completion_statements, 1);
                Stats::add(&stats.succeeded, written.succeeded);
                Stats::add(&stats.failed, written.failed);
                if written.fenced > 0 {
                    tracing::warn!(shard = %shard.name, fenced = written.fenced, "completions fenced out: their leases were lost and the jobs re-claimed");
                    Stats::add(&stats.fenced, written.fenced);
                }
                return;
            }
            Err(err) => {
                tracing::warn!(
                    shard = %shard.name,
                    jobs = part.len(),
                    retry_in_ms = delay.as_millis() as u64,
                    error = %crate::error_chain(&err),
                    "completion write failed; retrying"
                );
                tokio::select! {
                    _ = abandon.cancelled() => {
                        tracing::warn!(shard = %shard.name, jobs = part.len(), "completion write abandoned; the jobs return when their leases expire");
                        return;
                    }
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(MAX_RETRY_DELAY);
            }
        }
    }
}
