//! The completer: gathers outcomes per shard and writes each shard's batch in
//! one fenced statement, when it reaches the size threshold or when the flush
//! timer fires, whichever is first.
//!
//! Writes are limited per shard, never globally, so a shard that is down (its
//! writes retrying) cannot hold back completions for the others.

use super::Pipeline;
use crate::job::{Completion, Outcome};
use crate::store::jobs::{self, CompleteMany};
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
                    // The job has left the buffer: its room goes back now, so
                    // that writes stuck on one shard never stop claims on
                    // the others (a waiting completion is a few bytes).
                    completer.pipeline.room.add_permits(1);
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

/// Writes one shard's batch, retrying with backoff while the shard fails for
/// a passing reason. A write refused for its data (SQLSTATE class 22 or 23,
/// say a row a constraint rejects) is split to find the rows it fails on;
/// each such job is written as failed with the reason, and the rest as they
/// were. The jobs are let go of (their leases no longer extended) once written.
async fn write_with_retry(
    pipeline: Arc<Pipeline>,
    shard_index: usize,
    part: Vec<Completion>,
    abandon: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let shard = pipeline.shards.get(shard_index);
    let mut delay = FIRST_RETRY_DELAY;
    let mut todo = vec![part];
    while let Some(part) = todo.pop() {
        let write = CompleteMany {
            owner: &pipeline.owner,
            retry: pipeline.config.worker.retry_backoff,
            done: &part,
        };
        let result = jobs::complete_many(shard, write).await;
        match result {
            Ok(written) => {
                record_written(&pipeline, shard_index, &part, &written);
                pipeline.forget(part.iter().map(|c| (c.id, c.fence)));
                delay = FIRST_RETRY_DELAY;
            }
            Err(err) if err.is_permanent() => {
                let error = crate::error_chain(&err);
                match split_or_fail(part, &error) {
                    Ok((left, right)) => {
                        todo.push(right);
                        todo.push(left);
                    }
                    Err(Some(failed)) => {
                        tracing::warn!(shard = %shard.name, job = %failed.id, %error, "outcome refused by the database; writing the job as failed");
                        todo.push(vec![failed]);
                    }
                    Err(None) => {
                        tracing::error!(shard = %shard.name, %error, "even a failure could not be written; the job returns when its lease expires");
                    }
                }
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
                todo.push(part);
            }
        }
    }
}

/// After a permanent refusal of `part`: its two halves to write apart, or,
/// for a single job, that job as failed with `error` (`Err(Some)`), or
/// nothing left to try when it already was a failure report (`Err(None)`),
/// so that the job is let go and comes back by lease expiry.
fn split_or_fail(
    mut part: Vec<Completion>,
    error: &str,
) -> Result<(Vec<Completion>, Vec<Completion>), Option<Completion>> {
    if part.len() > 1 {
        let right = part.split_off(part.len() / 2);
        return Ok((part, right));
    }
    let mut one = part.pop().ok_or(None)?;
    let message = format!("the database refused this job's outcome: {error}");
    if matches!(&one.outcome, Outcome::Failed(m) if m.starts_with("the database refused")) {
        return Err(None);
    }
    one.outcome = Outcome::Failed(message).storable();
    Err(Some(one))
}

fn record_written(
    pipeline: &Pipeline,
    shard_index: usize,
    part: &[Completion],
    written: &jobs::Written,
) {
    let stats = &pipeline.stats;
    stats.add_written(written);
    stats.metrics.shards[shard_index].completed.fetch_add(
        part.len() as u64 - written.fenced,
        std::sync::atomic::Ordering::Relaxed,
    );
    stats
        .metrics
        .record_completion_lags(part.iter().map(|c| c.finished.elapsed()));
    if written.fenced > 0 {
        let shard = &pipeline.shards.get(shard_index).name;
        tracing::warn!(shard = %shard, fenced = written.fenced, "completions fenced out: their leases were lost and the jobs re-claimed");
    }
}
