//! The reshard run's enqueuer: plain, keyed and deduplicated jobs at a
//! steady pace over a few lanes (a blackout stalls one lane, not the run),
//! through proxies that lose some insert replies (an enqueue left
//! `OutcomeUnknown` is settled with `enqueue_again` until it answers, and
//! its final id recorded); each deduplicated job enqueued a second time
//! while it is still delayed, which must be refused or answered with the
//! first job's id.

use super::summary::{Summary, QUEUE};
use anyhow::Result;
use serde_json::json;
use shardq::job::JobId;
use shardq::{Client, ClientError, NewJob, OnDuplicate};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::RwLock;

/// Handler of the run's jobs (the chaos worker's): fails the first attempt
/// when the payload says so, sleeps `ms` first.
pub const HANDLER: &str = "reshard.fail_once";

/// Keys of the keyed jobs.
const KEYS: u64 = 50;

/// Enqueues in flight at once: a blackout holds one lane for its length
/// while the others go on.
const LANES: u64 = 4;

/// A deduplicated job's delay, at least: it is enqueued again before it
/// can run, even when its first enqueue took a blackout to settle.
const DEDUP_DELAY: Duration = Duration::from_secs(10);

/// How long an enqueue left `OutcomeUnknown` is settled for before the
/// run counts it as a failure.
const SETTLE_LIMIT: Duration = Duration::from_secs(120);

/// Pause between two `enqueue_again` of one enqueue.
const SETTLE_PAUSE: Duration = Duration::from_millis(200);

/// Payload `u` of a deduplicated job's second enqueue: its first's plus
/// this (when it is written, a job of its own that must run once).
pub const AGAIN: u64 = 1_000_000_000;

/// One job enqueued: its number (the payload's `u`) and final id.
#[derive(Debug, Clone)]
pub struct Enqueued {
    pub n: u64,
    pub id: JobId,
}

/// Job `n`: one in five deduplicated and delayed, two keyed, two plain;
/// one in ten fails its first attempt (every deduplicated one does); one in
/// seven runs 300 ms, so some are running when a move or a kill comes.
fn job(n: u64) -> NewJob {
    let dedup = n % 5 == 0;
    let fail_once = dedup || n % 10 == 3;
    let ms = if n % 7 == 0 { 300 } else { 0 };
    let job = NewJob::new(
        QUEUE,
        HANDLER,
        json!({ "u": n, "fail_once": fail_once, "ms": ms }),
    );
    match n % 5 {
        0 => job
            .dedup(format!("d-{n}"), OnDuplicate::Error)
            .delay(dedup_delay(n)),
        1 | 2 => job.ordering_key(format!("k-{}", n % KEYS)),
        _ => job,
    }
}

fn dedup_delay(n: u64) -> Duration {
    DEDUP_DELAY + Duration::from_millis(n % 2_000)
}

/// Enqueues `jobs` jobs evenly over `over`; returns what was enqueued.
/// Each job's enqueue, settling included, holds `gate` shared (the mover
/// takes it alone to empty a shard that left: see `super::empty`).
pub async fn run(
    client: Client,
    jobs: usize,
    over: Duration,
    summary: Arc<Mutex<Summary>>,
    gate: Arc<RwLock<()>>,
) -> Result<Vec<Enqueued>> {
    let started = Instant::now();
    let lanes = (0..LANES).map(|lane| {
        let (client, summary, gate) = (client.clone(), summary.clone(), gate.clone());
        tokio::spawn(async move {
            let mut out = Vec::new();
            for n in (lane..jobs as u64).step_by(LANES as usize) {
                let due = over.mul_f64(n as f64 / jobs.max(1) as f64);
                tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
                let _shared = gate.read().await;
                out.extend(one(&client, n, &summary).await);
            }
            out
        })
    });
    let mut out = Vec::with_capacity(jobs);
    for lane in futures_util::future::join_all(lanes).await {
        out.extend(lane?);
    }
    Ok(out)
}

/// Enqueues job `n` (and a deduplicated one again); returns what was
/// written, failures in the summary.
async fn one(client: &Client, n: u64, summary: &Mutex<Summary>) -> Vec<Enqueued> {
    let new = job(n);
    let dedup = new.dedup_id.clone();
    let asked = Instant::now();
    let id = match settle(client, new.clone(), summary).await {
        Ok(id) => id,
        Err(e) => {
            fail(summary, format!("enqueue of job {n} failed: {e}"));
            return Vec::new();
        }
    };
    let mut out = vec![Enqueued { n, id }];
    let Some(dedup) = dedup else { return out };
    // Every other one asks for the existing job's id instead of an error.
    let (on_duplicate, u) = (
        if n % 10 == 0 {
            OnDuplicate::Error
        } else {
            OnDuplicate::ReturnExisting
        },
        n + AGAIN,
    );
    let again =
        NewJob::new(QUEUE, HANDLER, json!({ "u": u, "ms": 0 })).dedup(dedup.clone(), on_duplicate);
    let answer = settle(client, again, summary).await;
    // Before the first job's delay ran out it cannot have run: its id was
    // held throughout.
    let held = asked.elapsed() < dedup_delay(n);
    let mut s = summary.lock().unwrap();
    match answer {
        Err(ClientError::Duplicate { existing, .. }) if existing == id => s.dedup_refused += 1,
        Ok(again) if again == id => s.dedup_existing += 1,
        Ok(again) if !held => {
            // Answered after the first may have finished: a job of its own.
            s.dedup_unjudged += 1;
            out.push(Enqueued { n: u, id: again });
        }
        other => s.failures.push(format!(
            "deduplicated job {n} ({id}, {dedup}) enqueued again ({on_duplicate:?}) \
             while it was held: {other:?}"
        )),
    }
    out
}

/// Enqueues `job`; an outcome left unknown (a lost reply) is settled with
/// `enqueue_again` until it answers, for [`SETTLE_LIMIT`] at most.
async fn settle(
    client: &Client,
    job: NewJob,
    summary: &Mutex<Summary>,
) -> Result<JobId, ClientError> {
    let started = Instant::now();
    let mut answer = client.enqueue(job).await;
    if matches!(answer, Err(ClientError::OutcomeUnknown { .. })) {
        summary.lock().unwrap().unknown_outcomes += 1;
    }
    loop {
        match answer {
            Err(ClientError::OutcomeUnknown { pending, .. })
                if started.elapsed() < SETTLE_LIMIT =>
            {
                tokio::time::sleep(SETTLE_PAUSE).await;
                summary.lock().unwrap().settled_again += 1;
                answer = client.enqueue_again(*pending).await.map(|ids| ids[0]);
            }
            done => return done,
        }
    }
}

fn fail(summary: &Mutex<Summary>, failure: String) {
    summary.lock().unwrap().failures.push(failure);
}
