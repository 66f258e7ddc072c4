//! Lost replies after commit: each shard sits behind a [`LossyProxy`] that,
//! now and then, closes the connection right after a transaction committed,
//! before the client sees the reply. Claims, completions, lease extensions,
//! releases and recoveries all land without their worker hearing of it. The
//! queue must still drain with nothing lost and nothing completed twice,
//! and keyed jobs must keep their order (README, "Guarantees").

use crate::common;

use common::TestShards;
use shardq::job::JobId;
use shardq::shards::ShardSet;
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use shardq_harness::lossy_proxy::LossyProxy;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const JOBS: usize = 2_000;
const QUEUES: [&str; 3] = ["lost-a", "lost-b", "lost-c"];
/// Keys per queue; every other job has one.
const KEYS: usize = 12;
/// Every this many jobs one (unkeyed) sleeps `SLOW_MS`.
const SLOW_EVERY: usize = 20;
const SLOW_MS: u64 = 400;
/// Chance that a reply after a commit is lost, per proxy.
const DROP_PROBABILITY: f64 = 0.08;
/// The whole drain must end within this, or the test fails (never hangs).
const DRAIN_LIMIT: Duration = Duration::from_secs(120);
/// ... and fails early when no job finished for this long (many leases).
const STALL_LIMIT: Duration = Duration::from_secs(20);

/// Small batches so that there are many claims (each one may lose its
/// reply); a short lease and statement deadline so that jobs a lost claim
/// left running under this worker come back within seconds (the leaser's
/// orphan release after a deadline, or lease recovery after 1.5 s); short
/// backoffs so that a shard skipped after a lost reply is visited again soon.
const WORKER_TOML: &str = "
[dequeue]
batch_size = 50
empty_backoff_min_ms = 5
empty_backoff_max_ms = 20
unhealthy_backoff_min_ms = 20
unhealthy_backoff_max_ms = 200
statement_timeout_ms = 1000
connect_timeout_ms = 1000
[worker]
queues = [\"lost-a\", \"lost-b\", \"lost-c\"]
concurrency = 4
producers = 2
buffer_jobs = 200
lease_ms = 1500
maintenance_interval_ms = 200
completion_flush_ms = 2
";

/// One run of the handler: the job, its attempt, and when it started and
/// ended on one global counter (so runs of a key can be put in order).
#[derive(Debug, Clone, Copy)]
struct Run {
    id: JobId,
    attempt: i32,
    start: u64,
    end: u64,
}

#[derive(Default)]
struct Runs {
    clock: AtomicU64,
    runs: Mutex<Vec<Run>>,
}

fn recording_registry(runs: Arc<Runs>) -> HandlerRegistry {
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("record", move |ctx| {
        let runs = runs.clone();
        async move {
            let start = runs.clock.fetch_add(1, Ordering::SeqCst);
            // Some jobs are held for a while, so that lease extensions (every
            // third of the lease) are sent, and lose replies, too; the rest
            // take a moment, so runs of one key would overlap if they could.
            match ctx.payload["sleep_ms"].as_u64() {
                Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                None => tokio::task::yield_now().await,
            }
            let end = runs.clock.fetch_add(1, Ordering::SeqCst);
            runs.runs.lock().unwrap().push(Run {
                id: ctx.id,
                attempt: ctx.attempt,
                start,
                end,
            });
            Ok(serde_json::json!({ "attempt": ctx.attempt }))
        }
    });
    registry
}

/// Which of shardq's statements `text` is, for the tally of dropped replies
/// (a transaction's reply is its `COMMIT`'s).
fn statement_name(text: &str) -> String {
    use shardq::store::sql;
    let known = [
        ("claim", sql::JOB_CLAIM),
        ("complete", sql::JOB_COMPLETE_MANY),
        ("extend leases", sql::JOB_EXTEND_LEASES),
        ("cancel poll", sql::JOB_CANCEL_REQUESTED),
        ("orphan check", sql::JOB_OWNED_RUNNING),
        ("promote due", sql::JOB_PROMOTE_DUE),
    ];
    known
        .iter()
        .find(|(_, statement)| *statement == text)
        .map_or_else(
            || text.chars().take(24).collect(),
            |(name, _)| name.to_string(),
        )
}

/// Per shard: jobs by status, and how many running ones have an expired
/// lease (a lost claim nobody gave back).
async fn progress(set: &ShardSet) -> Vec<BTreeMap<String, i64>> {
    let mut all = Vec::new();
    for shard in set.all() {
        let rows = shard
            .client()
            .await
            .unwrap()
            .query(
                "SELECT status, count(*) FROM workflow_status GROUP BY status \
                 UNION ALL SELECT 'running, lease expired', count(*) FROM workflow_status \
                 WHERE status = 'running' AND lease_expires_at < now()",
                &[],
            )
            .await
            .unwrap();
        all.push(rows.iter().map(|r| (r.get(0), r.get(1))).collect());
    }
    all
}

/// Jobs not finished yet, from [`progress`].
fn unfinished(progress: &[BTreeMap<String, i64>]) -> i64 {
    progress
        .iter()
        .flat_map(|shard| ["waiting", "scheduled", "queued", "running"].map(|s| shard.get(s)))
        .flatten()
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_lost_after_commit_lose_no_job_and_complete_none_twice() {
    let shards = TestShards::databases(2).await;
    // Migrate and enqueue directly; only the worker goes through the proxies.
    let direct = shards.config("");
    let set = shards.migrated(&direct).await;
    let client = Client::from_shards(set.clone(), direct.limits.clone());
    let mut keys = Vec::with_capacity(JOBS);
    let jobs: Vec<NewJob> = (0..JOBS)
        .map(|i| {
            let queue = QUEUES[i % QUEUES.len()];
            let payload = if i % SLOW_EVERY == 1 {
                serde_json::json!({ "i": i, "sleep_ms": SLOW_MS })
            } else {
                serde_json::json!({ "i": i })
            };
            let job = NewJob::new(queue, "record", payload);
            if i % 2 == 0 {
                let key = format!("key-{}", (i / 6) % KEYS);
                keys.push(Some((queue, key.clone())));
                job.ordering_key(key)
            } else {
                keys.push(None);
                job
            }
        })
        .collect();
    let ids = client.enqueue_many(jobs).await.unwrap();
    let key_of: HashMap<JobId, (&str, String)> = ids
        .iter()
        .zip(keys)
        .filter_map(|(id, key)| Some((*id, key?)))
        .collect();

    let proxies: Vec<LossyProxy> = shards
        .urls
        .iter()
        .map(|url| LossyProxy::start(shardq_harness::lossy_proxy::server_addr(url)))
        .collect();
    let proxied = TestShards {
        servers: Vec::new(),
        urls: shards
            .urls
            .iter()
            .zip(&proxies)
            .map(|(url, proxy)| {
                let server = shardq_harness::lossy_proxy::server_addr(url).to_string();
                assert!(url.contains(&server), "{url} names {server}");
                url.replace(&server, &proxy.addr().to_string())
            })
            .collect(),
    };
    let config = proxied.config(WORKER_TOML);
    for proxy in &proxies {
        proxy.set_drop_probability(DROP_PROBABILITY);
        // At random a run can lose no claim's reply (there are few claims);
        // the test is about both, so each shard loses at least one of each.
        proxy.drop_next(shardq::store::sql::JOB_CLAIM);
        proxy.drop_next(shardq::store::sql::JOB_COMPLETE_MANY);
    }

    let runs = Arc::new(Runs::default());
    let worker = Worker::new(
        config.clone(),
        ShardSet::connect(&config).unwrap(),
        recording_registry(runs.clone()),
    );
    let stats = worker.stats();
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));

    // Drain: watched on direct connections, with a hard limit, and failing
    // early when nothing finishes for a while (jobs stranded).
    let started = Instant::now();
    let mut last_log = Instant::now();
    let (mut last_unfinished, mut last_change) = (i64::MAX, Instant::now());
    loop {
        let now = progress(&set).await;
        let left = unfinished(&now);
        if left == 0 {
            break;
        }
        if left != last_unfinished {
            (last_unfinished, last_change) = (left, Instant::now());
        }
        let stalled = last_change.elapsed() > STALL_LIMIT;
        if started.elapsed() > DRAIN_LIMIT || stalled || running.is_finished() {
            let dropped: Vec<u64> = proxies.iter().map(LossyProxy::dropped).collect();
            panic!(
                "not drained after {:?} ({left} jobs unfinished, none finished for {:?}; \
                 worker finished: {}): jobs per shard {now:?}; replies dropped per proxy \
                 {dropped:?}; worker stats {:?}",
                started.elapsed(),
                last_change.elapsed(),
                running.is_finished(),
                stats.snapshot()
            );
        }
        if last_log.elapsed() > Duration::from_secs(5) {
            last_log = Instant::now();
            eprintln!("draining after {:?}: {now:?}", started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained_in = started.elapsed();
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the worker stops within 30 s")
        .unwrap();
    let dropped: Vec<u64> = proxies.iter().map(LossyProxy::dropped).collect();
    let mut dropped_by_statement: BTreeMap<String, u64> = BTreeMap::new();
    for proxy in &proxies {
        for text in proxy.dropped_statements() {
            *dropped_by_statement
                .entry(statement_name(&text))
                .or_default() += 1;
        }
    }
    drop(proxies);
    let runs = std::mem::take(&mut *runs.runs.lock().unwrap());
    eprintln!(
        "drained {JOBS} jobs in {drained_in:?}; replies dropped per proxy {dropped:?}; \
         {} handler runs; worker {:?}",
        runs.len(),
        report.stats
    );
    eprintln!("dropped replies by statement: {dropped_by_statement:?}");

    // (a) The fault happened, on every shard.
    for (shard, n) in dropped.iter().enumerate() {
        assert!(*n > 0, "proxy of shard {shard} dropped no reply");
    }
    for what in ["claim", "complete"] {
        assert!(
            dropped_by_statement.contains_key(what),
            "no {what} lost its reply: {dropped_by_statement:?}"
        );
    }

    // (b) Nothing lost, (c) nothing completed twice: one row per enqueued
    // job, each succeeded, its output written by its last attempt (a
    // completion by an older attempt would be a second completion), and that
    // attempt really ran.
    let mut rows = HashMap::new();
    for shard in set.all() {
        for row in shard
            .client()
            .await
            .unwrap()
            .query(
                "SELECT shard_key, id, status, attempts, (output->>'attempt')::int \
                 FROM workflow_status",
                &[],
            )
            .await
            .unwrap()
        {
            let id = JobId {
                shard_key: row.get(0),
                id: row.get(1),
            };
            let state: (String, i32, Option<i32>) = (row.get(2), row.get(3), row.get(4));
            assert!(rows.insert(id, state).is_none(), "two rows for job {id}");
        }
    }
    assert_eq!(rows.len(), JOBS, "one row per enqueued job");
    let mut ran: HashMap<JobId, Vec<Run>> = HashMap::new();
    for run in &runs {
        ran.entry(run.id).or_default().push(*run);
    }
    for id in &ids {
        let (status, attempts, output_attempt) = rows.get(id).expect("row of an enqueued job");
        assert_eq!(status, "succeeded", "job {id} (attempts {attempts})");
        assert_eq!(
            *output_attempt,
            Some(*attempts),
            "job {id}: output of another attempt than its last"
        );
        assert!(
            ran.get(id)
                .is_some_and(|r| r.iter().any(|r| Some(r.attempt) == *output_attempt)),
            "job {id}: its recorded attempt {output_attempt:?} never ran"
        );
    }
    // The worker newly wrote at most one success per job (a rewrite after a
    // lost reply counts as already written, not again).
    assert!(
        report.stats.succeeded <= JOBS as u64,
        "{} successes written for {JOBS} jobs",
        report.stats.succeeded
    );
    assert_eq!(report.stats.dead + report.stats.retrying, 0);

    // Per-key ordering: runs of one key never overlap, and the jobs of a key
    // first ran in id order.
    let mut per_key: HashMap<&(&str, String), Vec<Run>> = HashMap::new();
    for run in &runs {
        if let Some(key) = key_of.get(&run.id) {
            per_key.entry(key).or_default().push(*run);
        }
    }
    assert_eq!(per_key.len(), QUEUES.len() * KEYS, "every key ran");
    for (key, mut key_runs) in per_key {
        key_runs.sort_by_key(|r| r.start);
        for pair in key_runs.windows(2) {
            assert!(
                pair[0].end < pair[1].start,
                "key {key:?}: runs overlap: {:?} and {:?}",
                pair[0],
                pair[1]
            );
        }
        let mut first: HashMap<JobId, u64> = HashMap::new();
        for run in &key_runs {
            first.entry(run.id).or_insert(run.start);
        }
        let mut by_id: Vec<(JobId, u64)> = first.into_iter().collect();
        by_id.sort_by_key(|(id, _)| id.id);
        for pair in by_id.windows(2) {
            assert!(
                pair[0].1 < pair[1].1,
                "key {key:?}: job {} first ran after job {}",
                pair[0].0,
                pair[1].0
            );
        }
    }
    let repeated = ran.values().filter(|r| r.len() > 1).count();
    eprintln!("{repeated} jobs ran more than once (allowed: at-least-once)");
}
