//! The completer: gathers outcomes per shard and writes each shard's batch in
//! one fenced statement, when it reaches the size threshold or when the flush
//! timer fires, whichever is first.
//!
//! Writes are limited per shard, never globally, so a shard that is down (its
//! writes retrying) cannot hold back completions for the others.

use super::Pipeline;
use crate::dequeue;
use crate::job::Completion;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Completion writes in flight per shard: two overlap one statement's round
/// trip with the next batch's accumulation.
const WRITES_PER_SHARD: usize = 2;

/// First and longest pause between retries of a failed write.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(50);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

struct Completer {
    pipeline: Arc<Pipeline>,
    pending: Vec<Vec<Completion>>,
    writes: Vec<Arc<Semaphore>>,
    tasks: JoinSet<()>,
    abandon: CancellationToken,
}

/// Runs until `input` closes, then flushes everything and waits for the
/// writes. `abandon` cancels writes still retrying (their jobs come back by
/// lease expiry).
pub(crate) async fn run(
    pipeline: Arc<Pipeline>,
    mut input: mpsc::UnboundedReceiver<Completion>,
    abandon: CancellationToken,
) {
    let shards = pipeline.shards.len();
    let batch = pipeline.config.worker.completion_batch;
    let flush_every = pipeline
        .config
        .worker
        .completion_flush
        .max(Duration::from_millis(1));
    let mut completer = Completer {
        pending: vec![Vec::new(); shards],
        writes: (0..shards)
            .map(|_| Arc::new(Semaphore::new(WRITES_PER_SHARD)))
            .collect(),
        tasks: JoinSet::new(),
        pipeline,
        abandon,
    };
    let mut tick = tokio::time::interval(flush_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            received = input.recv() => match received {
                Some(done) => {
                    let shard = done.shard;
                    completer.pending[shard].push(done);
                    if completer.pending[shard].len() >= batch {
                        completer.try_flush(shard);
                    }
                }
                None => break,
            },
            _ = tick.tick() => completer.try_flush_all(),
            Some(_) = completer.tasks.join_next(), if !completer.tasks.is_empty() => {}
        }
    }
    // Final flush: wait for write permits as writes finish.
    loop {
        completer.try_flush_all();
        if completer.pending.iter().all(Vec::is_empty) {
            break;
        }
        if completer.tasks.join_next().await.is_none() {
            tokio::time::sleep(flush_every).await;
        }
    }
    while completer.tasks.join_next().await.is_some() {}
}

impl Completer {
    fn try_flush_all(&mut self) {
        for shard in 0..self.pending.len() {
            self.try_flush(shard);
        }
    }

    /// Starts writing shard `shard`'s pending batch if it has a write slot free;
    /// otherwise the batch keeps growing until one frees.
    fn try_flush(&mut self, shard: usize) {
        if self.pending[shard].is_empty() {
            return;
        }
        let Ok(permit) = self.writes[shard].clone().try_acquire_owned() else {
            return;
        };
        let part = std::mem::take(&mut self.pending[shard]);
        let pipeline = self.pipeline.clone();
        let abandon = self.abandon.clone();
        self.tasks
            .spawn(write_with_retry(pipeline, shard, part, abandon, permit));
    }
}

/// Writes one shard's batch, retrying with backoff while the shard is down.
/// The batch's room in the buffer is given back after the first attempt, so a
/// dead shard's completions (bounded: it gets no new claims) do not stop the
/// process from claiming on the other shards.
async fn write_with_retry(
    pipeline: Arc<Pipeline>,
    shard_index: usize,
    part: Vec<Completion>,
    abandon: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let shard = pipeline.shards.get(shard_index);
    let stats = &pipeline.stats;
    let mut room_returned = false;
    let mut delay = FIRST_RETRY_DELAY;
    loop {
        let retry = pipeline.config.worker.retry_backoff;
        let result = dequeue::complete_many(shard, &pipeline.owner, retry, &part).await;
        if !room_returned {
            pipeline.room.add_permits(part.len());
            room_returned = true;
        }
        match result {
            Ok(written) => {
                stats.add_written(&written);
                stats.metrics.shards[shard_index].completed.fetch_add(
                    part.len() as u64 - written.fenced,
                    std::sync::atomic::Ordering::Relaxed,
                );
                stats
                    .metrics
                    .record_completion_lags(part.iter().map(|c| c.finished.elapsed()));
                if written.fenced > 0 {
                    tracing::warn!(shard = %shard.name, fenced = written.fenced, "completions fenced out: their leases were lost and the jobs re-claimed");
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
