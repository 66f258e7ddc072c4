//! The enqueuer: puts the jobs in, in paced chunks, while the faults run.
//!
//! Every job has a unique payload `{"n": k}`. A chunk counts as enqueued only
//! when `enqueue_many` returned its ids; a chunk that failed may or may not
//! have been written (in part), so its numbers are never sent again: each is
//! acknowledged (must appear exactly once) or unacknowledged (at most once).

pub use super::names::is_workflow;
use super::names::{QUEUE, WORKFLOW_HANDLER};
use shardq::{Client, JobId, NewJob};
use std::time::{Duration, Instant};

/// Every other noop has one of this many ordering keys, so that keys are
/// held, parked and released under every fault: a key whose release were
/// lost would strand its jobs, and the run would count them as lost.
const ORDERING_KEYS: u64 = 64;

/// Chunks the jobs are split into, so that enqueueing stays continuous...
const TARGET_CHUNKS: usize = 200;
/// ...within these chunk sizes: one statement per shard per chunk.
const CHUNK_RANGE: (usize, usize) = (50, 1_000);

/// A chunk that takes longer than this is given up (unacknowledged).
const CHUNK_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after a failed chunk, doubling while chunks keep failing: a chunk
/// that fails on one shard is usually written on the others, so hammering a
/// restarting shard would flood the queue with unacknowledged jobs.
const RETRY_PAUSE_MIN: Duration = Duration::from_millis(200);
/// Longest pause between failed chunks.
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(2);

/// What the enqueuer did.
#[derive(Debug, Default)]
pub struct Load {
    /// `acknowledged[n]`: whether job `n` was acknowledged; every `n` below
    /// its length was sent exactly once.
    pub acknowledged: Vec<bool>,
    /// Acknowledged jobs.
    pub enqueued: u64,
    /// Acknowledged workflows among them.
    pub workflows: u64,
    /// Chunks that failed or timed out.
    pub failed_chunks: u64,
    /// The first failure, for the report.
    pub first_error: Option<String>,
    /// From the first chunk to the last acknowledgement.
    pub elapsed: Duration,
}

/// Enqueues `jobs` jobs (job `n` is `make(n)`), spread evenly over `spread`,
/// retrying failed chunks with fresh numbers; gives up at `deadline`. Each
/// acknowledged job's number and id go to `acked`.
pub async fn run(
    client: Client,
    jobs: usize,
    spread: Duration,
    deadline: Instant,
    make: impl Fn(u64) -> NewJob,
    acked: impl Fn(u64, JobId),
) -> Load {
    let chunk = (jobs / TARGET_CHUNKS).clamp(CHUNK_RANGE.0, CHUNK_RANGE.1);
    let chunks = jobs.div_ceil(chunk).max(1);
    let started = Instant::now();
    let mut load = Load::default();
    let mut sent_chunks = 0;
    let mut retry_pause = RETRY_PAUSE_MIN;
    while (load.enqueued as usize) < jobs && Instant::now() < deadline {
        let due = started + spread.mul_f64(sent_chunks as f64 / chunks as f64);
        tokio::time::sleep_until(due.into()).await;
        let first = load.acknowledged.len() as u64;
        let size = chunk.min(jobs - load.enqueued as usize) as u64;
        let batch: Vec<NewJob> = (first..first + size).map(&make).collect();
        load.acknowledged.resize((first + size) as usize, false);
        let outcome = tokio::time::timeout(CHUNK_TIMEOUT, client.enqueue_many(batch)).await;
        let error = match outcome {
            Ok(Ok(ids)) => {
                for (n, id) in (first..first + size).zip(ids) {
                    acked(n, id);
                }
                load.acknowledged[first as usize..].fill(true);
                load.enqueued += size;
                load.workflows += (first..first + size).filter(|&n| is_workflow(n)).count() as u64;
                load.elapsed = started.elapsed();
                sent_chunks += 1;
                retry_pause = RETRY_PAUSE_MIN;
                continue;
            }
            Ok(Err(err)) => shardq::error_chain(&err),
            Err(_) => format!("no answer within {CHUNK_TIMEOUT:?}"),
        };
        tracing::debug!(
            first,
            size,
            error,
            "enqueue chunk failed; retrying with new numbers"
        );
        load.failed_chunks += 1;
        load.first_error.get_or_insert(error);
        tokio::time::sleep(retry_pause).await;
        retry_pause = (retry_pause * 2).min(RETRY_PAUSE_MAX);
    }
    if (load.enqueued as usize) < jobs {
        tracing::error!(
            enqueued = load.enqueued,
            jobs,
            "the enqueuer ran out of time"
        );
    }
    load
}

/// Job `n` of the chaos run: a workflow, or a noop (half of them keyed).
pub fn new_job(n: u64) -> NewJob {
    let handler = if is_workflow(n) {
        WORKFLOW_HANDLER
    } else {
        shardq::worker::NOOP
    };
    let job = NewJob::new(QUEUE, handler, serde_json::json!({ "n": n }));
    if !is_workflow(n) && n % 2 == 1 {
        job.ordering_key(format!("chaos-{}", n % ORDERING_KEYS))
    } else {
        job
    }
}
