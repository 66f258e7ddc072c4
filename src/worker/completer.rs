//! The completer: gathers outcomes per shard and writes each shard's batch in
//! one fenced statement, when it reaches the size threshold or when the flush
//! timer fires, whichever is first.
//!
//! Writes are limited per shard, never globally, so a shard that is down (its
//! writes retrying) cannot hold back completions for the others.

use super::credits::BufferCredits;
use super::Shared;
use crate::config::{Backoff, Config};
use crate::job::{Completion, Outcome};
use crate::store::jobs::{self, CompleteMany};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Completion writes in flight per shard: two overlap one statement's round
/// trip with the next batch's accumulation.
const WRITES_PER_SHARD: usize = 2;

/// First and longest pause between retries of a failed write.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(50);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

/// The completer's settings, from [`Config`].
#[derive(Debug, Clone)]
pub(crate) struct CompleterConfig {
    /// A shard's pending completions are written once this many wait
    /// (`worker.completion_batch`).
    pub batch: usize,
    /// ... or when this timer fires, whichever is first
    /// (`worker.completion_flush`, at least 1 ms).
    pub flush: Duration,
    /// Retry delays of failed jobs (`worker.retry_backoff`).
    pub retry: Backoff,
    /// Writes in flight per shard.
    pub writes_per_shard: usize,
}

impl CompleterConfig {
    pub fn new(config: &Config) -> Self {
        CompleterConfig {
            batch: config.worker.completion_batch,
            flush: config.worker.completion_flush.max(Duration::from_millis(1)),
            retry: config.worker.retry_backoff,
            writes_per_shard: WRITES_PER_SHARD,
        }
    }
}

/// One shard's batch to write.
#[derive(Debug)]
pub(crate) struct Write {
    pub shard: usize,
    pub part: Vec<Completion>,
}

/// The completer's decisions, without I/O or clocks: which shard's pending
/// completions to write, and when. A shard's batch is written when it
/// reaches the size threshold ([`Batcher::push`]) or on the flush timer
/// ([`Batcher::flush`]), in both cases only while the shard has fewer than
/// `writes_per_shard` writes in flight; otherwise it keeps growing until one
/// finishes ([`Batcher::written`]).
#[derive(Debug)]
pub(crate) struct Batcher {
    batch: usize,
    writes_per_shard: usize,
    pending: Vec<Vec<Completion>>,
    in_flight: Vec<usize>,
}

impl Batcher {
    pub fn new(shards: usize, batch: usize, writes_per_shard: usize) -> Self {
        Batcher {
            batch,
            writes_per_shard: writes_per_shard.max(1),
            pending: vec![Vec::new(); shards],
            in_flight: vec![0; shards],
        }
    }

    /// An outcome arrived: a write to start if its shard's batch is full now.
    pub fn push(&mut self, done: Completion) -> Option<Write> {
        let shard = done.shard;
        self.pending[shard].push(done);
        if self.pending[shard].len() >= self.batch {
            self.take(shard)
        } else {
            None
        }
    }

    /// The flush timer fired (or the input ended): a write for every shard
    /// with pending outcomes and a write slot free.
    pub fn flush(&mut self) -> Vec<Write> {
        (0..self.pending.len())
            .filter_map(|shard| self.take(shard))
            .collect()
    }

    /// A write on `shard` finished (written, given up or abandoned).
    pub fn written(&mut self, shard: usize) {
        self.in_flight[shard] = self.in_flight[shard].saturating_sub(1);
    }

    /// Whether no outcome waits to be written.
    pub fn is_empty(&self) -> bool {
        self.pending.iter().all(Vec::is_empty)
    }

    fn take(&mut self, shard: usize) -> Option<Write> {
        if self.pending[shard].is_empty() || self.in_flight[shard] >= self.writes_per_shard {
            return None;
        }
        self.in_flight[shard] += 1;
        Some(Write {
            shard,
            part: std::mem::take(&mut self.pending[shard]),
        })
    }
}

/// Runs until `input` closes, then flushes everything and waits for the
/// writes. `abandon` cancels writes still retrying (their jobs come back by
/// lease expiry).
pub(crate) async fn run(
    config: CompleterConfig,
    shared: Arc<Shared>,
    credits: BufferCredits,
    input: mpsc::Receiver<Completion>,
    abandon: CancellationToken,
) {
    let retry = config.retry;
    let shards = shared.shards.len();
    let write = move |w: Write| {
        let shared = shared.clone();
        let abandon = abandon.clone();
        async move { write_with_retry(&shared, w.shard, w.part, retry, &abandon).await }
    };
    drive(&config, shards, input, &credits, write).await;
}

/// The completer's loop over any writer (the tests' writes take no database).
///
/// As each outcome reaches it, its buffer credit goes back at once, so
/// that writes stuck on one shard never stop claims on the others (a
/// waiting completion is a few bytes).
async fn drive<W, F>(
    config: &CompleterConfig,
    shards: usize,
    mut input: mpsc::Receiver<Completion>,
    credits: &BufferCredits,
    mut write: W,
) where
    W: FnMut(Write) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let mut batcher = Batcher::new(shards, config.batch, config.writes_per_shard);
    let mut writes = Writes::default();
    let mut tick = tokio::time::interval(config.flush);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            received = input.recv() => match received {
                Some(done) => {
                    credits.give_back(1);
                    if let Some(w) = batcher.push(done) {
                        writes.start(w, &mut write);
                    }
                }
                None => break,
            },
            _ = tick.tick() => {
                for w in batcher.flush() {
                    writes.start(w, &mut write);
                }
            }
            Some(shard) = writes.next(), if !writes.is_empty() => batcher.written(shard),
        }
    }
    // Final flush: wait for write slots as writes finish.
    loop {
        for w in batcher.flush() {
            writes.start(w, &mut write);
        }
        if batcher.is_empty() {
            break;
        }
        match writes.next().await {
            Some(shard) => batcher.written(shard),
            None => tokio::time::sleep(config.flush).await,
        }
    }
    while writes.next().await.is_some() {}
}

/// Writes in flight, each known by its shard (even one that panicked).
#[derive(Default)]
struct Writes {
    tasks: JoinSet<()>,
    shards: HashMap<tokio::task::Id, usize>,
}

impl Writes {
    fn start<W, F>(&mut self, w: Write, write: &mut W)
    where
        W: FnMut(Write) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let shard = w.shard;
        let handle = self.tasks.spawn(write(w));
        self.shards.insert(handle.id(), shard);
    }

    fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The shard of the next write to finish; `None` when none is in flight.
    async fn next(&mut self) -> Option<usize> {
        let id = match self.tasks.join_next_with_id().await? {
            Ok((id, ())) => id,
            Err(err) => err.id(),
        };
        self.shards.remove(&id)
    }
}

/// Writes one shard's batch, retrying with backoff while the shard fails for
/// a passing reason. A write refused for its data (SQLSTATE class 22 or 23,
/// say a row a constraint rejects) is split to find the rows it fails on;
/// each such job is written as failed with the reason, and the rest as they
/// were. The jobs are let go of (their leases no longer extended) once written.
async fn write_with_retry(
    shared: &Shared,
    shard_index: usize,
    part: Vec<Completion>,
    retry: Backoff,
    abandon: &CancellationToken,
) {
    let shard = shared.shards.get(shard_index);
    let mut delay = FIRST_RETRY_DELAY;
    let mut todo = vec![part];
    while let Some(part) = todo.pop() {
        let write = CompleteMany {
            owner: &shared.owner,
            retry,
            done: &part,
        };
        let result = jobs::complete_many(shard, write).await;
        match result {
            Ok(written) => {
                record_written(shared, shard_index, &part, &written);
                shared.running.forget(part.iter().map(|c| (c.id, c.fence)));
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
    shared: &Shared,
    shard_index: usize,
    part: &[Completion],
    written: &jobs::Written,
) {
    let stats = &shared.stats;
    stats.add_written(written);
    stats.metrics.record_outcomes(shard_index, written);
    stats.metrics.shards[shard_index].completed.fetch_add(
        part.len() as u64 - written.fenced,
        std::sync::atomic::Ordering::Relaxed,
    );
    stats
        .metrics
        .record_completion_lags(shard_index, part.iter().map(|c| c.finished.elapsed()));
    if written.fenced > 0 {
        let shard = &shared.shards.get(shard_index).name;
        tracing::warn!(shard = %shard, fenced = written.fenced, "completions fenced out: their leases were lost and the jobs re-claimed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobId;
    use std::sync::Mutex;
    use tokio::time::Instant;

    fn done(shard: usize, id: i64) -> Completion {
        Completion {
            id: JobId { shard_key: 0, id },
            shard,
            fence: 1,
            keyed: false,
            outcome: Outcome::Succeeded(serde_json::Value::Null),
            finished: std::time::Instant::now(),
        }
    }

    fn config(batch: usize, flush_ms: u64) -> CompleterConfig {
        CompleterConfig {
            batch,
            flush: Duration::from_millis(flush_ms),
            retry: Backoff {
                min: Duration::from_secs(1),
                max: Duration::from_secs(1),
            },
            writes_per_shard: WRITES_PER_SHARD,
        }
    }

    /// What the fake writer saw: (when, shard, jobs), and the most writes
    /// in flight at once per shard.
    #[derive(Default)]
    struct Log {
        writes: Vec<(Duration, usize, usize)>,
        in_flight: Vec<usize>,
        most_in_flight: Vec<usize>,
    }

    /// A completer over `shards` shards whose writes take `takes` each.
    fn start(
        config: CompleterConfig,
        shards: usize,
        takes: Duration,
    ) -> (
        mpsc::Sender<Completion>,
        BufferCredits,
        Arc<Mutex<Log>>,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = mpsc::channel(1024);
        let credits = BufferCredits::new(1024);
        let log = Arc::new(Mutex::new(Log {
            in_flight: vec![0; shards],
            most_in_flight: vec![0; shards],
            ..Log::default()
        }));
        let began = Instant::now();
        let write = {
            let log = log.clone();
            move |w: Write| {
                let log = log.clone();
                async move {
                    {
                        let mut log = log.lock().unwrap();
                        log.writes.push((began.elapsed(), w.shard, w.part.len()));
                        log.in_flight[w.shard] += 1;
                        log.most_in_flight[w.shard] =
                            log.most_in_flight[w.shard].max(log.in_flight[w.shard]);
                    }
                    tokio::time::sleep(takes).await;
                    log.lock().unwrap().in_flight[w.shard] -= 1;
                }
            }
        };
        let driving = tokio::spawn({
            let credits = credits.clone();
            async move { drive(&config, shards, rx, &credits, write).await }
        });
        (tx, credits, log, driving)
    }

    fn writes(log: &Mutex<Log>) -> Vec<(Duration, usize, usize)> {
        log.lock().unwrap().writes.clone()
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_is_written_at_once() {
        let (tx, _credits, log, _driving) = start(config(3, 10_000), 1, Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(1)).await;
        for id in 0..3 {
            tx.send(done(0, id)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let seen = writes(&log);
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!((seen[0].1, seen[0].2), (0, 3));
        assert!(seen[0].0 < Duration::from_millis(10), "{seen:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_partial_batch_waits_for_the_timer() {
        let (tx, _credits, log, _driving) = start(config(100, 50), 2, Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(1)).await;
        tx.send(done(0, 1)).await.unwrap();
        tx.send(done(1, 2)).await.unwrap();
        tx.send(done(1, 3)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(writes(&log).is_empty(), "nothing before the timer");
        tokio::time::sleep(Duration::from_millis(40)).await;
        let mut seen: Vec<_> = writes(&log).iter().map(|w| (w.1, w.2)).collect();
        seen.sort();
        assert_eq!(seen, vec![(0, 1), (1, 2)]);
        assert!(writes(&log)
            .iter()
            .all(|w| w.0 >= Duration::from_millis(50) && w.0 < Duration::from_millis(60)));
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_left_is_written_when_the_input_closes() {
        let (tx, credits, log, driving) = start(config(100, 3_600_000), 2, Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(1)).await;
        for id in 0..5 {
            tx.send(done(0, id)).await.unwrap();
        }
        tx.send(done(1, 9)).await.unwrap();
        drop(tx);
        tokio::time::timeout(Duration::from_secs(1), driving)
            .await
            .expect("the completer ends soon after its input")
            .unwrap();
        let mut seen: Vec<_> = writes(&log).iter().map(|w| (w.1, w.2)).collect();
        seen.sort();
        assert_eq!(seen, vec![(0, 5), (1, 1)]);
        // One credit back per outcome received.
        assert_eq!(credits.free(), 1024 + 6);
    }

    #[tokio::test(start_paused = true)]
    async fn writes_per_shard_are_limited_and_one_slow_shard_holds_back_no_other() {
        let (tx, credits, log, driving) = start(config(1, 5), 2, Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(1)).await;
        for id in 0..20 {
            tx.send(done(0, id)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Shard 0 has its two writes in flight; the rest waits, but its
        // credits came back at once.
        assert_eq!(writes(&log).len(), 2);
        assert_eq!(credits.free(), 1024 + 20);
        tx.send(done(1, 100)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(writes(&log).last().map(|w| (w.1, w.2)), Some((1, 1)));
        drop(tx);
        driving.await.unwrap();
        let log = log.lock().unwrap();
        assert_eq!(log.most_in_flight, vec![2, 1]);
        let written: usize = log.writes.iter().filter(|w| w.1 == 0).map(|w| w.2).sum();
        assert_eq!(written, 20);
    }

    #[test]
    fn batcher_grows_a_batch_while_the_shard_has_no_write_slot() {
        let mut b = Batcher::new(1, 2, 1);
        assert!(b.push(done(0, 1)).is_none());
        assert_eq!(b.push(done(0, 2)).map(|w| w.part.len()), Some(2));
        assert!(b.push(done(0, 3)).is_none());
        assert!(b.push(done(0, 4)).is_none());
        assert!(b.flush().is_empty());
        b.written(0);
        let w = b.flush();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].part.len(), 2);
        assert!(b.is_empty());
    }
}
