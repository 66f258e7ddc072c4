//! The completer: gathers outcomes per shard and writes each shard's batch in
//! one fenced statement, when it reaches the size threshold or when the flush
//! timer fires, whichever is first.
//!
//! Writes are limited per shard, never globally, so a shard that is down (its
//! writes retrying) cannot hold back completions for the others.

use super::credits::BufferCredits;
use super::worker_run::WorkerRun;
use crate::config::{Backoff, Config};
use crate::job::{Completion, Outcome};
use crate::store::jobs::{self, CompleteMany};
use crate::store::ErrorKind;
use crate::telemetry::Stats;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Completion writes in flight per shard: two overlap one statement's round
/// trip with the next batch's accumulation.
const WRITES_PER_SHARD: usize = 2;

/// The most keyed outcomes one completion statement carries. The statement
/// takes one advisory lock per distinct key, all held until it commits, in
/// the server's shared lock table: `max_locks_per_transaction` (64 by
/// default) times `max_connections` (100) plus a little, about 6,400 on a
/// stock server, shared by every session (the write failed with `out of
/// shared memory` at ~20,000 keys on shardq's local servers). A thousand
/// keeps one write to a sixth of a stock table, so a few processes' writes
/// fit at once; when they do not, the write is split (see
/// [`write_with_retry`]). Keyed rows count as keys: a key has one running
/// job at a time, so a batch's keyed outcomes are nearly all distinct keys.
const MAX_KEYS_PER_WRITE: usize = 1_000;

/// First and longest pause between retries of a failed write.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(50);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

/// Tries of one job's outcome that the server refuses for want of lock room
/// or memory (53200) before the job is given up. A batch that fails so is
/// split; a single outcome cannot be, and while the leaser still extends
/// its lease, retrying it without bound keeps the job `running` forever.
/// With the retry backoff these tries span about 1.5 s: long enough for a
/// passing peak of another session's locks to end.
const ONE_OUTCOME_OUT_OF_MEMORY_TRIES: u32 = 5;

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
    /// Most keyed outcomes per statement.
    pub keys_per_write: usize,
}

impl CompleterConfig {
    pub(crate) fn new(config: &Config) -> Self {
        CompleterConfig {
            batch: config.worker.completion_batch,
            flush: config.worker.completion_flush.max(Duration::from_millis(1)),
            retry: config.worker.retry_backoff,
            writes_per_shard: WRITES_PER_SHARD,
            keys_per_write: MAX_KEYS_PER_WRITE,
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
/// completions to write, and when. A shard's batch is written when it is
/// full ([`Batcher::push`]: `batch` outcomes, or `keys_per_write` keyed
/// ones) or on the flush timer ([`Batcher::flush`]), in both cases only
/// while the shard has fewer than `writes_per_shard` writes in flight;
/// otherwise it waits until one finishes ([`Batcher::written`]). A write
/// takes the oldest pending outcomes, at most `batch` of them and at most
/// `keys_per_write` keyed ones; the rest wait for the next.
///
/// A keyed outcome waits while an earlier write of its key is in flight,
/// whatever else goes: two writes in flight may commit in either order, and
/// each stamps `finished_at` with its transaction's start, so a key's later
/// job could show the earlier finish. Started after the earlier write ends,
/// the later write's transaction starts after that commit.
#[derive(Debug)]
pub(crate) struct Batcher {
    batch: usize,
    keys_per_write: usize,
    writes_per_shard: usize,
    pending: Vec<VecDeque<Completion>>,
    /// Keyed outcomes among each shard's pending ones.
    keyed: Vec<usize>,
    in_flight: Vec<usize>,
    /// Each shard's keys in writes in flight, with how many outcomes of
    /// each those writes carry.
    keys_in_flight: Vec<HashMap<u64, usize>>,
}

impl Batcher {
    pub(crate) fn new(
        shards: usize,
        batch: usize,
        keys_per_write: usize,
        writes_per_shard: usize,
    ) -> Self {
        Batcher {
            batch: batch.max(1),
            keys_per_write: keys_per_write.max(1),
            writes_per_shard: writes_per_shard.max(1),
            pending: vec![VecDeque::new(); shards],
            keyed: vec![0; shards],
            in_flight: vec![0; shards],
            keys_in_flight: vec![HashMap::new(); shards],
        }
    }

    /// An outcome arrived: a write to start if its shard's batch is full now.
    pub(crate) fn push(&mut self, done: Completion) -> Option<Write> {
        let shard = done.shard;
        self.keyed[shard] += usize::from(done.keyed());
        self.pending[shard].push_back(done);
        if self.is_full(shard) {
            self.take(shard)
        } else {
            None
        }
    }

    /// The flush timer fired (or the input ended): a write for every shard
    /// with pending outcomes and a write slot free.
    pub(crate) fn flush(&mut self) -> Vec<Write> {
        (0..self.pending.len())
            .filter_map(|shard| self.take(shard))
            .collect()
    }

    /// A write on `shard` carrying outcomes of `keys` finished (written,
    /// given up or abandoned): the next write there, at once, when a full
    /// batch waits for it.
    pub(crate) fn written(&mut self, shard: usize, keys: &[u64]) -> Option<Write> {
        self.in_flight[shard] = self.in_flight[shard].saturating_sub(1);
        let busy = &mut self.keys_in_flight[shard];
        for key in keys {
            if let Some(n) = busy.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    busy.remove(key);
                }
            }
        }
        if self.is_full(shard) {
            self.take(shard)
        } else {
            None
        }
    }

    /// Whether no outcome waits to be written.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.iter().all(VecDeque::is_empty)
    }

    fn is_full(&self, shard: usize) -> bool {
        self.pending[shard].len() >= self.batch || self.keyed[shard] >= self.keys_per_write
    }

    fn take(&mut self, shard: usize) -> Option<Write> {
        let pending = &mut self.pending[shard];
        if pending.is_empty() || self.in_flight[shard] >= self.writes_per_shard {
            return None;
        }
        let busy = &self.keys_in_flight[shard];
        let mut part = Vec::with_capacity(pending.len().min(self.batch));
        let mut passed_over = Vec::new();
        let mut keyed = 0;
        while part.len() < self.batch {
            let Some(next) = pending.pop_front() else {
                break;
            };
            match next.key {
                Some(key) if busy.contains_key(&key) => passed_over.push(next),
                Some(_) if keyed >= self.keys_per_write => {
                    pending.push_front(next);
                    break;
                }
                key => {
                    keyed += usize::from(key.is_some());
                    part.push(next);
                }
            }
        }
        // What waits for its key's write goes back in front, in its order.
        for waiting in passed_over.into_iter().rev() {
            pending.push_front(waiting);
        }
        if part.is_empty() {
            return None;
        }
        self.keyed[shard] -= keyed;
        for key in part.iter().filter_map(|c| c.key) {
            *self.keys_in_flight[shard].entry(key).or_default() += 1;
        }
        self.in_flight[shard] += 1;
        Some(Write { shard, part })
    }
}

/// Runs until `input` closes, then flushes everything and waits for the
/// writes. `abandon` cancels writes still retrying (their jobs come back by
/// lease expiry).
pub(crate) async fn run(
    config: CompleterConfig,
    run: Arc<WorkerRun>,
    credits: BufferCredits,
    input: mpsc::Receiver<Completion>,
    abandon: CancellationToken,
) {
    let retry = config.retry;
    let shards = run.shards.len();
    let stats = run.clone();
    let write = move |w: Write| {
        let run = run.clone();
        let abandon = abandon.clone();
        async move { write_with_retry(&run, w.shard, w.part, retry, &abandon).await }
    };
    drive(&config, shards, input, &credits, &stats.stats, write).await;
}

/// The completer's loop over any writer (the tests' writes take no database).
///
/// As each outcome reaches it, its buffer credit goes back at once, so that
/// writes stuck on one shard do not take buffer room from the others; its
/// held credit goes back when its write ends, so that stuck writes stop
/// claims once a buffer's worth of outcomes waits (see `credits`).
async fn drive<W, F>(
    config: &CompleterConfig,
    shards: usize,
    mut input: mpsc::Receiver<Completion>,
    credits: &BufferCredits,
    stats: &Stats,
    mut write: W,
) where
    W: FnMut(Write) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let mut batcher = Batcher::new(
        shards,
        config.batch,
        config.keys_per_write,
        config.writes_per_shard,
    );
    let mut writes = Writes::default();
    let mut tick = tokio::time::interval(config.flush);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            received = input.recv() => match received {
                Some(done) => {
                    credits.reached_completer(usize::from(done.credited));
                    stats.record_outcomes_arrived(1);
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
            Some(ended) = writes.next(), if !writes.is_empty() => {
                settled(credits, stats, ended.settled);
                if let Some(w) = batcher.written(ended.shard, &ended.keys) {
                    writes.start(w, &mut write);
                }
            }
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
            Some(ended) => {
                settled(credits, stats, ended.settled);
                if let Some(w) = batcher.written(ended.shard, &ended.keys) {
                    writes.start(w, &mut write);
                }
            }
            None => tokio::time::sleep(config.flush).await,
        }
    }
    while let Some(ended) = writes.next().await {
        settled(credits, stats, ended.settled);
    }
}

/// A write's outcomes ended (each written, fenced or given up): their jobs
/// stop counting against the buffer (those that held credits).
fn settled(credits: &BufferCredits, stats: &Stats, n: Settled) {
    credits.settled(n.credited);
    stats.record_outcomes_settled(n.outcomes as u64);
}

/// What a finished write settles: its outcomes, and how many of them held
/// buffer credits.
#[derive(Debug, Clone, Copy)]
struct Settled {
    outcomes: usize,
    credited: usize,
}

/// A write that ended: its shard, what it settles and the keys it carried.
struct Ended {
    shard: usize,
    settled: Settled,
    keys: Vec<u64>,
}

/// Writes in flight, each known by its shard, size and keys (even one that
/// panicked).
#[derive(Default)]
struct Writes {
    tasks: JoinSet<()>,
    started: HashMap<tokio::task::Id, Ended>,
}

impl Writes {
    fn start<W, F>(&mut self, w: Write, write: &mut W)
    where
        W: FnMut(Write) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let ended = Ended {
            shard: w.shard,
            settled: Settled {
                outcomes: w.part.len(),
                credited: w.part.iter().filter(|c| c.credited).count(),
            },
            keys: w.part.iter().filter_map(|c| c.key).collect(),
        };
        let handle = self.tasks.spawn(write(w));
        self.started.insert(handle.id(), ended);
    }

    fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The next write to finish (all its outcomes written, fenced or given
    /// up); `None` when none is in flight.
    async fn next(&mut self) -> Option<Ended> {
        let id = match self.tasks.join_next_with_id().await? {
            Ok((id, ())) => id,
            Err(err) => err.id(),
        };
        self.started.remove(&id)
    }
}

/// Writes one shard's batch, retrying with backoff while the shard fails for
/// a passing reason. A write refused for its data (SQLSTATE class 22 or 23,
/// say a row a constraint rejects) is split to find the rows it fails on;
/// each such job is written as failed with the reason, and the rest as they
/// were. A write the server had no memory or lock room for (53200) is split
/// in halves, each retried at once: the same statement would fail the same
/// way, a smaller one takes fewer locks; one outcome refused so
/// [`ONE_OUTCOME_OUT_OF_MEMORY_TRIES`] times in a row is given up. The jobs are let go of (their
/// leases no longer extended) once written, fenced or given up, so a job
/// whose outcome cannot be written returns by lease expiry.
async fn write_with_retry(
    run: &WorkerRun,
    shard_index: usize,
    part: Vec<Completion>,
    retry: Backoff,
    abandon: &CancellationToken,
) {
    let shard = run.shards.get(shard_index);
    let mut delay = FIRST_RETRY_DELAY;
    // Consecutive 53200 refusals of a single outcome (the job at the top).
    let mut alone_out_of_memory = 0;
    let mut todo = vec![Part {
        done: part,
        report: false,
    }];
    while let Some(Part {
        done: mut part,
        report,
    }) = todo.pop()
    {
        let write = CompleteMany {
            owner: &run.owner,
            retry,
            done: &part,
        };
        let result = jobs::complete_many(shard, write).await;
        match result {
            Ok(written) => {
                run.health.writes_succeeded(shard_index);
                record_written(run, shard_index, &part, &written);
                let_go(run, &part);
                delay = FIRST_RETRY_DELAY;
                alone_out_of_memory = 0;
            }
            Err(err) if err.is_permanent() => {
                let error = crate::error_chain::error_chain(&err);
                match split_or_fail(Part { done: part, report }, &error) {
                    Ok((left, right)) => {
                        todo.push(right);
                        todo.push(left);
                    }
                    Err(Failed::Instead(failed)) => {
                        tracing::warn!(shard = %shard.name, job = %failed.id, %error, "outcome refused by the database; writing the job as failed");
                        todo.push(Part {
                            done: vec![failed],
                            report: true,
                        });
                    }
                    Err(Failed::GiveUp(given_up)) => {
                        tracing::error!(shard = %shard.name, job = %given_up.id, %error, "even a failure could not be written; the job returns when its lease expires");
                        let_go(run, std::slice::from_ref(&given_up));
                    }
                }
            }
            Err(err) if err.kind() == ErrorKind::OutOfMemory && part.len() > 1 => {
                let right = part.split_off(part.len() / 2);
                tracing::warn!(
                    shard = %shard.name,
                    jobs = part.len() + right.len(),
                    error = %crate::error_chain::error_chain(&err),
                    "completion write too big for the server's lock table or memory; splitting it"
                );
                todo.push(Part {
                    done: right,
                    report,
                });
                todo.push(Part { done: part, report });
            }
            Err(err)
                if err.kind() == ErrorKind::OutOfMemory
                    && alone_out_of_memory + 1 >= ONE_OUTCOME_OUT_OF_MEMORY_TRIES =>
            {
                tracing::error!(
                    shard = %shard.name,
                    job = %part[0].id,
                    tries = ONE_OUTCOME_OUT_OF_MEMORY_TRIES,
                    error = %crate::error_chain::error_chain(&err),
                    "the server has no room for even this one outcome; giving the job up, it returns when its lease expires"
                );
                let_go(run, &part);
                delay = FIRST_RETRY_DELAY;
                alone_out_of_memory = 0;
            }
            Err(err) => {
                if err.kind() == ErrorKind::OutOfMemory {
                    alone_out_of_memory += 1;
                }
                // The slots set the shard's jobs aside until a write succeeds.
                run.health.write_failed(shard_index);
                tracing::warn!(
                    shard = %shard.name,
                    jobs = part.len(),
                    retry_in_ms = delay.as_millis() as u64,
                    error = %crate::error_chain::error_chain(&err),
                    "completion write failed; retrying"
                );
                tokio::select! {
                    _ = abandon.cancelled() => {
                        tracing::warn!(shard = %shard.name, jobs = part.len(), "completion write abandoned; the jobs return when their leases expire");
                        let_go(run, &part);
                        todo.into_iter().for_each(|rest| let_go(run, &rest.done));
                        return;
                    }
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(MAX_RETRY_DELAY);
                todo.push(Part { done: part, report });
            }
        }
    }
}

/// Stops holding these jobs: their outcomes are written, fenced or given up,
/// so the leaser no longer extends their leases.
fn let_go(run: &WorkerRun, part: &[Completion]) {
    run.running.forget(part.iter().map(|c| (c.id, c.fence)));
}

/// Outcomes to write in one statement.
#[derive(Debug)]
struct Part {
    done: Vec<Completion>,
    /// Whether this is the refusal report written in place of a job's
    /// refused outcome (one job): refused too, the job is given up.
    report: bool,
}

/// What to do with one job whose outcome the database refused for good.
#[derive(Debug)]
enum Failed {
    /// Write it as failed, with the refusal as its error.
    Instead(Completion),
    /// It already was that failure: give it up (it returns by lease expiry).
    GiveUp(Completion),
}

/// After a permanent refusal of `part`: its two halves to write apart, or,
/// for a single job, that job as failed with `error`, or, when it already
/// was that failure report, the job to give up, so that it is let go and
/// comes back by lease expiry.
fn split_or_fail(part: Part, error: &str) -> Result<(Part, Part), Failed> {
    let Part {
        done: mut part,
        report,
    } = part;
    if part.len() > 1 {
        let right = part.split_off(part.len() / 2);
        return Ok((
            Part { done: part, report },
            Part {
                done: right,
                report,
            },
        ));
    }
    let mut one = part.pop().expect("a write carries at least one outcome");
    if report {
        return Err(Failed::GiveUp(one));
    }
    let message = format!("the database refused this job's outcome: {error}");
    // A failure for good stays one: its report must not bring back the
    // attempts it gave up.
    one.outcome = match one.outcome {
        Outcome::Dead(_) => Outcome::Dead(message),
        _ => Outcome::Failed(message),
    }
    .storable();
    Err(Failed::Instead(one))
}

fn record_written(
    run: &WorkerRun,
    shard_index: usize,
    part: &[Completion],
    written: &jobs::Written,
) {
    run.stats.record_written(
        shard_index,
        written,
        part.iter().map(|c| c.finished.elapsed()),
    );
    if written.fenced > 0 {
        let shard = &run.shards.get(shard_index).name;
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
            key: None,
            outcome: Outcome::Succeeded(serde_json::Value::Null),
            finished: std::time::Instant::now(),
            credited: true,
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
            keys_per_write: MAX_KEYS_PER_WRITE,
        }
    }

    /// What the fake writer saw: (when, shard, jobs), and the most writes
    /// in flight at once per shard.
    #[derive(Default)]
    struct Log {
        writes: Vec<(Duration, usize, usize)>,
        /// Each write's jobs, with when it started and when it ended.
        spans: Vec<(Vec<i64>, Duration, Duration)>,
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
                    let start = began.elapsed();
                    tokio::time::sleep(takes).await;
                    let mut log = log.lock().unwrap();
                    log.in_flight[w.shard] -= 1;
                    let ids = w.part.iter().map(|c| c.id.id).collect();
                    log.spans.push((ids, start, began.elapsed()));
                }
            }
        };
        let driving = tokio::spawn({
            let credits = credits.clone();
            async move { drive(&config, shards, rx, &credits, &Stats::new(shards), write).await }
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
        // One credit of each kind back per outcome received and written.
        assert_eq!(credits.free(), 1024 + 6);
        assert_eq!(credits.free_held(), 2048 + 6);
    }

    /// A late claim's jobs given back for want of room hold no credits: their
    /// outcomes are written like the others and give none back (giving back
    /// credits never taken would let claims overfill the buffer).
    #[tokio::test(start_paused = true)]
    async fn outcomes_without_credits_are_written_and_give_none_back() {
        let (tx, credits, log, driving) = start(config(100, 3_600_000), 1, Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(1)).await;
        for id in 0..5 {
            let mut d = done(0, id);
            d.credited = id < 3;
            tx.send(d).await.unwrap();
        }
        drop(tx);
        tokio::time::timeout(Duration::from_secs(1), driving)
            .await
            .expect("the completer ends soon after its input")
            .unwrap();
        let seen: Vec<_> = writes(&log).iter().map(|w| (w.1, w.2)).collect();
        assert_eq!(seen, vec![(0, 5)], "every outcome is written");
        assert_eq!(credits.free(), 1024 + 3);
        assert_eq!(credits.free_held(), 2048 + 3);
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
        // buffer credits came back at once. Its held credits come back as
        // writes end.
        assert_eq!(writes(&log).len(), 2);
        assert_eq!(credits.free(), 1024 + 20);
        assert_eq!(credits.free_held(), 2048);
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
    fn batcher_holds_a_full_batch_until_the_shard_has_a_write_slot() {
        let mut b = Batcher::new(1, 2, 1_000, 1);
        assert!(b.push(done(0, 1)).is_none());
        assert_eq!(b.push(done(0, 2)).map(|w| w.part.len()), Some(2));
        assert!(b.push(done(0, 3)).is_none());
        assert!(b.push(done(0, 4)).is_none());
        assert!(b.flush().is_empty());
        let w = b
            .written(0, &[])
            .expect("a full batch goes as the slot frees");
        assert_eq!(w.part.len(), 2);
        assert!(b.is_empty());
    }

    /// An outcome of a job with a key of its own.
    fn keyed(shard: usize, id: i64) -> Completion {
        of_key(shard, id, id as u64)
    }

    fn of_key(shard: usize, id: i64, key: u64) -> Completion {
        Completion {
            key: Some(key),
            ..done(shard, id)
        }
    }

    fn ids(w: &Write) -> Vec<i64> {
        w.part.iter().map(|c| c.id.id).collect()
    }

    #[test]
    fn batcher_cuts_a_backlog_into_writes_of_at_most_the_batch() {
        let mut b = Batcher::new(1, 2, 1_000, 1);
        let first = b.push(done(0, 0)).or_else(|| b.push(done(0, 1))).unwrap();
        assert_eq!(ids(&first), vec![0, 1]);
        for id in 2..7 {
            assert!(b.push(done(0, id)).is_none(), "the write slot is taken");
        }
        // The backlog goes out oldest first, a batch at a time, each as
        // soon as the write before it ends.
        assert_eq!(b.written(0, &[]).map(|w| ids(&w)), Some(vec![2, 3]));
        assert_eq!(b.written(0, &[]).map(|w| ids(&w)), Some(vec![4, 5]));
        assert!(b.written(0, &[]).is_none(), "one left waits for the timer");
        assert_eq!(b.flush().iter().map(ids).collect::<Vec<_>>(), vec![vec![6]]);
    }

    #[test]
    fn batcher_cuts_a_write_at_the_most_keys_per_statement() {
        let mut b = Batcher::new(1, 10, 3, 1);
        assert!(b.push(keyed(0, 1)).is_none());
        assert!(b.push(keyed(0, 2)).is_none());
        // Three keyed outcomes fill a write, though the batch takes ten.
        assert_eq!(b.push(keyed(0, 3)).map(|w| ids(&w)), Some(vec![1, 2, 3]));
        for c in [
            keyed(0, 4),
            done(0, 5),
            keyed(0, 6),
            keyed(0, 7),
            keyed(0, 8),
            done(0, 9),
        ] {
            assert!(b.push(c).is_none(), "the write slot is taken");
        }
        // The next write stops before a fourth keyed outcome; unkeyed ones
        // ride along.
        assert_eq!(
            b.written(0, &[1, 2, 3]).map(|w| ids(&w)),
            Some(vec![4, 5, 6, 7])
        );
        assert!(
            b.written(0, &[4, 6, 7]).is_none(),
            "one keyed outcome is no full batch"
        );
        assert_eq!(
            b.flush().iter().map(ids).collect::<Vec<_>>(),
            vec![vec![8, 9]]
        );
        assert!(b.is_empty());
    }

    #[test]
    fn batcher_holds_a_keys_outcome_while_an_earlier_write_of_the_key_is_in_flight() {
        let mut b = Batcher::new(1, 2, 1_000, 2);
        assert!(b.push(of_key(0, 1, 7)).is_none());
        assert_eq!(b.push(done(0, 2)).map(|w| ids(&w)), Some(vec![1, 2]));
        assert!(b.push(of_key(0, 3, 7)).is_none());
        // A full batch, but job 3's key is in the write in flight: only the
        // outcome behind it goes, though a second write slot is free.
        assert_eq!(b.push(of_key(0, 4, 8)).map(|w| ids(&w)), Some(vec![4]));
        assert!(b.flush().is_empty(), "job 3 waits for its key's write");
        assert!(b.written(0, &[8]).is_none());
        assert!(b.flush().is_empty(), "another key's write ended");
        assert!(b.written(0, &[7]).is_none(), "no full batch");
        assert_eq!(b.flush().iter().map(ids).collect::<Vec<_>>(), vec![vec![3]]);
        assert!(b.is_empty());
    }

    /// Two writes in flight may commit in either order; a key's later
    /// outcome must not be written before its earlier one is (its
    /// transaction, and so its `finished_at`, would come first).
    #[tokio::test(start_paused = true)]
    async fn a_keys_outcomes_are_written_one_write_after_another() {
        let (tx, _credits, log, driving) = start(config(1, 5), 1, Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(1)).await;
        tx.send(of_key(0, 1, 7)).await.unwrap();
        tx.send(of_key(0, 2, 7)).await.unwrap();
        tx.send(done(0, 3)).await.unwrap();
        drop(tx);
        driving.await.unwrap();
        let spans = log.lock().unwrap().spans.clone();
        let span = |id: i64| {
            spans
                .iter()
                .find(|(ids, ..)| ids.contains(&id))
                .map(|(_, start, end)| (*start, *end))
                .unwrap()
        };
        assert!(
            span(2).0 >= span(1).1,
            "job 2's write began before job 1's ended: {spans:?}"
        );
        assert!(
            span(3).0 < span(1).1,
            "another key's outcome does not wait: {spans:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn held_credits_come_back_when_the_write_ends_not_when_the_outcome_arrives() {
        let (tx, credits, log, driving) = start(config(5, 5), 1, Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(1)).await;
        for id in 0..5 {
            tx.send(keyed(0, id)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(writes(&log).len(), 1);
        assert_eq!((credits.free(), credits.free_held()), (1024 + 5, 2048));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(credits.free_held(), 2048 + 5);
        drop(tx);
        driving.await.unwrap();
    }

    /// A handler's own failure that happens to read like shardq's refusal
    /// report is still a handler's failure: when the database refuses it,
    /// the refusal is written instead, not the job given up.
    #[test]
    fn only_shardqs_own_refusal_report_is_given_up() {
        let mut handlers = done(0, 1);
        handlers.outcome = Outcome::Failed("the database refused my card".into());
        let part = Part {
            done: vec![handlers],
            report: false,
        };
        let failed = match split_or_fail(part, "error 22021") {
            Err(Failed::Instead(failed)) => failed,
            other => panic!("a handler's failure must be replaced by the report: {other:?}"),
        };
        assert!(matches!(&failed.outcome, Outcome::Failed(m) if m.contains("error 22021")));
        // The report itself, refused again, is given up.
        let report = Part {
            done: vec![failed],
            report: true,
        };
        assert!(matches!(
            split_or_fail(report, "error 22021"),
            Err(Failed::GiveUp(_))
        ));
    }
}
