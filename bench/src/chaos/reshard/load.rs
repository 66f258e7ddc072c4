//! The reshard run's enqueuer: plain, keyed and deduplicated jobs at a
//! steady pace, through proxies that lose some insert replies (each such
//! enqueue settled with `enqueue_again` until it answers); each
//! deduplicated job enqueued a second time at once, which must be refused.

use super::{Summary, QUEUE};
use anyhow::Result;
use serde_json::json;
use shardq::job::JobId;
use shardq::{Client, ClientError, NewJob, OnDuplicate};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Handler of the run's jobs (the chaos worker's): fails the first attempt
/// when the payload says so, sleeps `ms` first.
pub const HANDLER: &str = "reshard.fail_once";

/// Keys of the keyed jobs.
const KEYS: u64 = 50;

/// One job enqueued: its number (the payload's `u`) and id.
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
            .delay(Duration::from_millis(300 + n % 1_200)),
        1 | 2 => job.ordering_key(format!("k-{}", n % KEYS)),
        _ => job,
    }
}

/// Enqueues `jobs` jobs evenly over `over`; returns what was enqueued.
pub async fn run(
    client: Client,
    jobs: usize,
    over: Duration,
    summary: Arc<Mutex<Summary>>,
) -> Result<Vec<Enqueued>> {
    let started = Instant::now();
    let mut out = Vec::with_capacity(jobs);
    for n in 0..jobs as u64 {
        let due = over.mul_f64(n as f64 / jobs.max(1) as f64);
        tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
        let new = job(n);
        let dedup = new.dedup_id.clone();
        match settle(&client, new.clone(), &summary).await {
            Ok(id) => out.push(Enqueued { n, id }),
            Err(e) => {
                summary
                    .lock()
                    .unwrap()
                    .failures
                    .push(format!("enqueue of job {n} failed: {e}"));
                continue;
            }
        }
        if let Some(d) = &dedup {
            match settle(&client, new, &summary).await {
                Err(ClientError::Duplicate { .. }) => summary.lock().unwrap().dedup_refused += 1,
                other => {
                    let seen = holders(&client, d).await;
                    summary.lock().unwrap().failures.push(format!(
                        "deduplicated job {n} enqueued again while unfinished: {other:?}; \
                         its rows now: {seen}"
                    ))
                }
            }
        }
    }
    Ok(out)
}

/// Enqueues `job`; an outcome left unknown (a lost reply) is settled with
/// `enqueue_again` until it answers.
async fn settle(
    client: &Client,
    job: NewJob,
    summary: &Mutex<Summary>,
) -> Result<JobId, ClientError> {
    let mut answer = client.enqueue(job).await;
    for _ in 0..100 {
        match answer {
            Err(ClientError::OutcomeUnknown { pending, .. }) => {
                summary.lock().unwrap().settled_again += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                answer = client.enqueue_again(*pending).await.map(|ids| ids[0]);
            }
            done => return done,
        }
    }
    answer
}

/// Every row holding deduplication id `d`, with each shard's newest epoch
/// and moves, for a failure's report.
async fn holders(client: &Client, d: &str) -> String {
    let mut out = Vec::new();
    for shard in client.shards().all() {
        let Ok(db) = shard.client().await else {
            continue;
        };
        let rows = db
            .query(
                "SELECT id, shard_key, status, held_status, created_at::text, \
                     (SELECT max(epoch) FROM shardq_map_epochs)::text, \
                     (SELECT string_agg(first_key || '-' || end_key || ':' || from_index || '>' \
                         || to_index || ' ' || state, ', ') FROM shardq_map_moves \
                      WHERE epoch = (SELECT max(epoch) FROM shardq_map_epochs)) \
                 FROM workflow_status WHERE dedup_id = $1",
                &[&d],
            )
            .await;
        for row in rows.into_iter().flatten() {
            out.push(format!(
                "{}: id {} key {} {} {:?} created {} epoch {:?} moves {:?}",
                shard.name,
                row.get::<_, i64>(0),
                row.get::<_, i32>(1),
                row.get::<_, String>(2),
                row.get::<_, Option<String>>(3),
                row.get::<_, String>(4),
                row.get::<_, Option<String>>(5),
                row.get::<_, Option<String>>(6),
            ));
        }
    }
    out.join("; ")
}
