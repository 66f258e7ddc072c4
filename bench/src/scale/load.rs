//! Load generation: noop (or `sleep`) jobs inserted straight onto each shard (the
//! library's own insert statement), so the bench knows exactly how many each
//! shard got even when one shard fails for a while. Either a burst (as fast
//! as the inserts go) or a fixed rate credited by real elapsed time.

use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use shardq::router;
use shardq::shards::{Shard, ShardError, ShardSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

/// Rows per insert statement.
const CHUNK: usize = 5_000;

/// How often the rate enqueuer credits jobs.
const TICK: Duration = Duration::from_millis(5);

/// Pause before retrying an insert that failed (the shard is locked or down).
const RETRY_AFTER: Duration = Duration::from_millis(20);

/// Longest a shard may keep refusing inserts before the run fails.
const GIVE_UP_AFTER: Duration = Duration::from_secs(120);

/// Attempts each job gets (the default); the check wants exactly one used.
const MAX_ATTEMPTS: i32 = 20;

/// `count` shard keys of shard `shard` of `n`, uniformly random within its range.
fn keys_for(shard: usize, n: usize, count: usize, rng: &mut impl Rng) -> Vec<i32> {
    let space = router::SHARD_KEY_SPACE as u64;
    let lo = (shard as u64 * space).div_ceil(n as u64);
    let hi = ((shard as u64 + 1) * space).div_ceil(n as u64);
    (0..count)
        .map(|_| rng.gen_range(lo..hi) as i32)
        .inspect(|&k| debug_assert_eq!(router::shard_index(k, n), shard))
        .collect()
}

/// The handler and payload of the bench's jobs: `noop`, or the built-in
/// `sleep` for `job_ms` when it is not 0.
fn job(job_ms: u64) -> (&'static str, Value) {
    if job_ms == 0 {
        (shardq::worker::NOOP, json!({}))
    } else {
        (shardq::worker::SLEEP, json!({ "ms": job_ms }))
    }
}

/// Inserts one job per key on `shard` in one statement; all or nothing.
async fn insert(shard: &Shard, queue: &str, job_ms: u64, keys: &[i32]) -> Result<u64, ShardError> {
    let db = shard.client().await?;
    let stmt = db
        .prepare_cached(shardq::store::sql::JOB_INSERT_MANY)
        .await
        .map_err(|e| shard.query_error(e))?;
    let n = keys.len();
    let (handler, payload) = job(job_ms);
    let payloads: Vec<&Value> = vec![&payload; n];
    let ordering: Vec<Option<&str>> = vec![None; n];
    db.execute(
        &stmt,
        &[
            &keys,
            &vec![queue; n],
            &vec![handler; n],
            &ordering,
            &vec![0i32; n],
            &payloads,
            &vec![0i64; n],
            &vec![MAX_ATTEMPTS; n],
        ],
    )
    .await
    .map_err(|e| shard.query_error(e))
}

/// Inserts `keys` on `shard`, retrying a failed statement until it succeeds
/// (or [`GIVE_UP_AFTER`]).
async fn insert_retrying(shard: &Shard, queue: &str, job_ms: u64, keys: &[i32]) -> Result<u64> {
    let started = Instant::now();
    loop {
        match insert(shard, queue, job_ms, keys).await {
            Ok(n) => return Ok(n),
            Err(err) if started.elapsed() < GIVE_UP_AFTER => {
                tracing::debug!(error = %shardq::error_chain(&err), "insert failed; retrying");
                tokio::time::sleep(RETRY_AFTER).await;
            }
            Err(err) => bail!(
                "{} kept refusing inserts: {}",
                shard.name,
                shardq::error_chain(&err)
            ),
        }
    }
}

/// Enqueues `per_shard` jobs on each of the first `n` shards as fast as it
/// can (shards in parallel); the task returns the counts by shard.
pub fn burst(
    shards: &ShardSet,
    n: usize,
    per_shard: usize,
    queue: &str,
    job_ms: u64,
) -> JoinHandle<Result<Vec<u64>>> {
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let (shard, queue) = (shards.get(i).clone(), queue.to_string());
        tasks.spawn(async move {
            let mut done = 0;
            while (done as usize) < per_shard {
                let count = CHUNK.min(per_shard - done as usize);
                let keys = keys_for(i, n, count, &mut rand::thread_rng());
                done += insert_retrying(&shard, &queue, job_ms, &keys).await?;
            }
            Ok::<_, anyhow::Error>((i, done))
        });
    }
    tokio::spawn(async move {
        let mut counts = vec![0; n];
        while let Some(joined) = tasks.join_next().await {
            let (i, done) = joined??;
            counts[i] = done;
        }
        Ok(counts)
    })
}

/// Offers `rate` jobs/s over the first `n` shards (a uniformly random shard
/// key each, as the client routes) from `t0` for `duration`; the task ends
/// when every credited job is inserted and returns the counts by shard.
pub fn rate(
    shards: &ShardSet,
    n: usize,
    rate: f64,
    t0: Instant,
    duration: Duration,
    queue: &str,
    job_ms: u64,
) -> JoinHandle<Result<Vec<u64>>> {
    let inserted: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let mut senders = Vec::with_capacity(n);
    let mut inserters = JoinSet::new();
    for i in 0..n {
        let (tx, rx) = mpsc::unbounded_channel::<i32>();
        senders.push(tx);
        let (shard, queue, counts) = (shards.get(i).clone(), queue.to_string(), inserted.clone());
        inserters.spawn(inserter(shard, queue, job_ms, rx, counts, i));
    }
    tokio::spawn(async move {
        credit(senders, n, rate, t0, duration).await;
        while let Some(joined) = inserters.join_next().await {
            joined??;
        }
        Ok(inserted.iter().map(|c| c.load(Relaxed)).collect())
    })
}

/// Credits `rate × elapsed` jobs, each to a random shard, until `duration` has passed.
async fn credit(
    senders: Vec<mpsc::UnboundedSender<i32>>,
    n: usize,
    rate: f64,
    t0: Instant,
    duration: Duration,
) {
    let total = (rate * duration.as_secs_f64()).round() as u64;
    let mut credited = 0u64;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rng = rand::rngs::StdRng::from_entropy();
    while credited < total {
        tick.tick().await;
        let due = ((rate * t0.elapsed().as_secs_f64()) as u64).min(total);
        for _ in credited..due {
            let key = router::random_shard_key(&mut rng);
            let _ = senders[router::shard_index(key, n)].send(key);
        }
        credited = credited.max(due);
    }
}

/// Inserts the keys of one shard as they come, in chunks, until the channel closes.
async fn inserter(
    shard: Shard,
    queue: String,
    job_ms: u64,
    mut rx: mpsc::UnboundedReceiver<i32>,
    counts: Arc<Vec<AtomicU64>>,
    i: usize,
) -> Result<()> {
    while let Some(first) = rx.recv().await {
        let mut keys = vec![first];
        while keys.len() < CHUNK {
            match rx.try_recv() {
                Ok(k) => keys.push(k),
                Err(_) => break,
            }
        }
        let n = insert_retrying(&shard, &queue, job_ms, &keys).await?;
        counts[i].fetch_add(n, Relaxed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_route_to_their_shard() {
        let mut rng = rand::thread_rng();
        for n in 1..=7 {
            for shard in 0..n {
                for k in keys_for(shard, n, 200, &mut rng) {
                    assert_eq!(router::shard_index(k, n), shard, "n={n} k={k}");
                }
            }
        }
    }
}
