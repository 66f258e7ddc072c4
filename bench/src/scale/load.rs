//! Load generation: noop (or `sleep`) jobs inserted straight onto each shard (the
//! library's own exactly-once insert: ids first, then the rows under them), so
//! the bench knows exactly how many each shard got even when one shard fails
//! or loses a reply for a while. Either a burst (as fast
//! as the inserts go) or a fixed rate credited by real elapsed time.

use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use shardq::job::NewJob;
use shardq::router;
use shardq::shards::{Shard, ShardError, ShardSet};
use shardq::store::jobs::{self, NewRow};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

/// Jobs per insert call (the store writes them in statements of 5,000).
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

/// Inserts one job per key on `shard`, exactly once however often a try
/// fails: the ids are taken first ([`jobs::reserve_ids`], which writes
/// nothing), then the rows are written under them ([`jobs::insert_many_as`]);
/// every try after the first skips the rows an earlier one wrote (its reply
/// lost: a restarting or frozen shard), as the client's own enqueue does
/// (`src/client/enqueue_once.rs`). So the bench's count of each shard's jobs
/// is the rows there, and a lost reply is retried without a duplicate.
/// Retries until the shard accepts (or [`GIVE_UP_AFTER`]); returns how many
/// jobs it enqueued (all of `keys`).
///
/// Between the two statements nothing else writes these ids: they were
/// taken from the shard's sequence for this call alone.
async fn insert_retrying(shard: &Shard, queue: &str, job_ms: u64, keys: &[i32]) -> Result<u64> {
    let (handler, payload) = job(job_ms);
    let new_job = NewJob::new(queue, handler, payload);
    let rows: Vec<NewRow> = keys
        .iter()
        .map(|&shard_key| NewRow {
            shard_key,
            job: &new_job,
            max_attempts: MAX_ATTEMPTS,
        })
        .collect();
    let ids = retrying(shard, |_| jobs::reserve_ids(shard, keys.len())).await?;
    retrying(shard, |again| {
        jobs::insert_many_as(shard, &rows, &ids, None, again)
    })
    .await?;
    Ok(keys.len() as u64)
}

/// Runs `op` until it succeeds, for up to [`GIVE_UP_AFTER`]; `op` is told
/// whether an earlier try may have written something.
async fn retrying<T, F, Fut>(shard: &Shard, mut op: F) -> Result<T>
where
    F: FnMut(bool) -> Fut,
    Fut: std::future::Future<Output = Result<T, ShardError>>,
{
    let started = Instant::now();
    for tries in 0u64.. {
        match op(tries > 0).await {
            Ok(value) => return Ok(value),
            Err(err) if started.elapsed() < GIVE_UP_AFTER && !err.is_permanent() => {
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
    unreachable!("the loop returns")
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
    use shardq::config::Config;
    use shardq_harness::lossy_proxy::LossyProxy;
    use shardq_local::EphemeralServer;

    /// Inserts of the test: many statements, so that many replies can be lost.
    const CALLS: usize = 60;
    const KEYS_PER_CALL: usize = 20;
    /// Chance that a reply after a commit is lost: high, so that a run
    /// without one is all but impossible (0.7^120).
    const DROP_PROBABILITY: f64 = 0.3;

    /// The loader's count of a shard's jobs is the rows there, though the
    /// shard loses the replies of committed inserts (as a restarting one
    /// does): each insert whose reply was lost is retried without writing
    /// its jobs a second time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_insert_whose_reply_was_lost_is_retried_without_a_duplicate() {
        let server = EphemeralServer::start().await.expect("start postgres");
        let port = server.server().port;
        let proxy = LossyProxy::start(([127, 0, 0, 1], port).into());
        let url = server
            .url()
            .replace(&format!(":{port}/"), &format!(":{}/", proxy.addr().port()));
        let config =
            Config::from_toml(&format!("[[shards]]\nname = \"s0\"\nurl = \"{url}\"\n")).unwrap();
        let shards = ShardSet::connect(&config).unwrap();
        shardq::migrate::migrate_all(&shards).await.unwrap();
        let shard = shards.get(0);
        proxy.set_drop_probability(DROP_PROBABILITY);
        let mut counted = 0;
        for _ in 0..CALLS {
            let keys = keys_for(0, 1, KEYS_PER_CALL, &mut rand::thread_rng());
            counted += insert_retrying(shard, "lost", 0, &keys).await.unwrap();
        }
        proxy.set_drop_probability(0.0);
        assert!(proxy.dropped() > 0, "some replies were lost");
        let db = shard.client().await.unwrap();
        let rows: i64 = db
            .query_one(
                "SELECT count(*) FROM workflow_status WHERE queue = 'lost'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            counted,
            (CALLS * KEYS_PER_CALL) as u64,
            "every job counted once"
        );
        assert_eq!(
            rows as u64,
            counted,
            "rows on the shard = jobs the loader counted ({} replies lost)",
            proxy.dropped()
        );
    }

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
