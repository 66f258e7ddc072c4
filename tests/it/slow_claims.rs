//! A shard whose claims answer, but later than their budget (issue 35: a
//! long transaction holds its xmin horizon and every claim walks dead
//! index entries). One shard, reached through a proxy that holds replies:
//!
//! - when that shard is the only one with work (alone, or beside an idle
//!   healthy shard), skipping it cannot help: the worker keeps claiming
//!   there and drains it at the slow pace, even while its probes are slow
//!   too (before, it waited for a probe within the budget, which never
//!   came, and the backlog sat untouched);
//! - the jobs of a late reply run: their leases are fresh, and giving them
//!   back rewrites their rows (running → queued), adding the dead row
//!   versions that slow the claims in the first place.

use crate::common;

use common::TestShards;
use shardq::shards::{Shard, ShardSet};
use shardq::store::sql::JOB_CLAIM;
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use shardq_harness::lossy_proxy::{server_addr, Fault, LossyProxy};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Each held reply's extra time: past the longest claim budget (250 ms).
const SLOW: Duration = Duration::from_millis(400);

/// A shard at `url` migrated and given `jobs` jobs of queue `slow` with
/// handler `handler` and `payload`; a proxy in front of it, slow with
/// [`SLOW`] for the replies to statements containing `delay_only` (all
/// when `None`); the worker's config through the proxy with `settings`.
async fn slow_shard(
    settings: &str,
    jobs: usize,
    handler: &str,
    payload: serde_json::Value,
    delay_only: Option<&str>,
) -> (TestShards, ShardSet, LossyProxy, shardq::Config) {
    let shards = TestShards::databases(1).await;
    let config = shards.config(settings);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let jobs = (0..jobs)
        .map(|_| NewJob::new("slow", handler, payload.clone()))
        .collect();
    client.enqueue_many(jobs).await.expect("enqueue");
    let url = &shards.urls[0];
    let proxy = LossyProxy::start(server_addr(url));
    proxy.set_delay_only(delay_only);
    proxy.set_fault(Fault::Delay(SLOW));
    let through = TestShards {
        servers: Vec::new(),
        urls: vec![url.replace(&server_addr(url).to_string(), &proxy.addr().to_string())],
    }
    .config(settings);
    (shards, set, proxy, through)
}

/// Jobs of `shard` not succeeded yet, and those of them claimed.
async fn unfinished(shard: &Shard) -> (i64, i64) {
    let db = shard.client().await.expect("client");
    let row = db
        .query_one(
            "SELECT count(*) FILTER (WHERE status <> 'succeeded'), \
                    count(*) FILTER (WHERE status = 'running') \
             FROM workflow_status",
            &[],
        )
        .await
        .expect("count");
    (row.get(0), row.get(1))
}

/// What a drain showed.
struct Drain {
    /// How long until every job succeeded; `None`: not within the limit.
    took: Option<Duration>,
    /// The most jobs seen claimed at once.
    most_claimed: i64,
}

/// Polls until every job of `shard` succeeded, or `limit` passed.
async fn drain(shard: &Shard, limit: Duration) -> Drain {
    let started = Instant::now();
    let mut most_claimed = 0;
    let took = loop {
        let (left, claimed) = unfinished(shard).await;
        most_claimed = most_claimed.max(claimed);
        if left == 0 {
            break Some(started.elapsed());
        }
        if started.elapsed() > limit {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    Drain { took, most_claimed }
}

/// One producer, small claims: the test sees many claims.
const ONE_SLOW_SHARD: &str = "
[dequeue]
batch_size = 50
[worker]
queues = [\"slow\"]
producers = 1
buffer_jobs = 200
";

/// Jobs in the slow-shard test: a dozen claims of 50.
const JOBS: usize = 600;
/// A claim of 50 every ~0.5 s (400 ms held, plus the pause before the
/// next claim) drains them in ~6 s; the rest is room for a loaded host.
/// Before, the worker ran the first claim's jobs and no more.
const DRAIN_LIMIT: Duration = Duration::from_secs(45);

/// Runs a worker on `config` until `shard` has no job left or
/// `DRAIN_LIMIT` passes; how long it took (`None`: not drained), and the
/// worker's counters then.
async fn drained_by_a_worker(
    config: &shardq::config::Config,
    shard: &Shard,
) -> (Option<Duration>, shardq::worker::StatsSnapshot) {
    let worker = Worker::new(
        config.clone(),
        ShardSet::connect(config).expect("pools"),
        HandlerRegistry::with_builtins(),
    );
    let stats = worker.stats();
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let drained = drain(shard, DRAIN_LIMIT).await.took;
    let seen = stats.snapshot();
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the worker stops")
        .expect("worker");
    (drained, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_shard_that_alone_has_work_keeps_being_claimed_from() {
    // Every reply slow, the probes' too: no probe is ever within budget.
    let (_shards, set, _proxy, through) =
        slow_shard(ONE_SLOW_SHARD, JOBS, "noop", serde_json::json!({}), None).await;
    let (drained, seen) = drained_by_a_worker(&through, set.get(0)).await;
    let (left, _) = unfinished(set.get(0)).await;
    let drained = drained.unwrap_or_else(|| {
        panic!(
            "{left} of {JOBS} jobs still not run after {DRAIN_LIMIT:?} on the one shard with \
             work, whose replies all take {SLOW:?}; worker {seen:?}"
        )
    });
    eprintln!(
        "drained {JOBS} jobs in {drained:?} ({:.0} jobs/s) with every reply {SLOW:?} late; \
         {} claims past their budget, {} jobs given back",
        JOBS as f64 / drained.as_secs_f64(),
        seen.claims_detached,
        seen.released
    );
}

/// Two shards on one server: the first healthy and idle, the second, with
/// every job (keyed so that they route there), behind a proxy whose every
/// reply takes [`SLOW`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_shard_beside_an_idle_one_keeps_being_claimed_from() {
    let shards = TestShards::databases(2).await;
    let config = shards.config(ONE_SLOW_SHARD);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let jobs: Vec<NewJob> = (0..)
        .map(|i| NewJob::new("slow", "noop", serde_json::json!({})).ordering_key(format!("k{i}")))
        .filter(|job| client.route(job.clone()).expect("route").shard().index == 1)
        .take(JOBS)
        .collect();
    client.enqueue_many(jobs).await.expect("enqueue");
    let url = &shards.urls[1];
    let proxy = LossyProxy::start(server_addr(url));
    proxy.set_fault(Fault::Delay(SLOW));
    let mut urls = shards.urls.clone();
    urls[1] = url.replace(&server_addr(url).to_string(), &proxy.addr().to_string());
    let through = TestShards {
        servers: Vec::new(),
        urls,
    }
    .config(ONE_SLOW_SHARD);
    let (drained, seen) = drained_by_a_worker(&through, set.get(1)).await;
    let drained = drained.unwrap_or_else(|| {
        panic!("the slow shard's jobs not run after {DRAIN_LIMIT:?}; worker {seen:?}")
    });
    eprintln!(
        "drained {JOBS} jobs in {drained:?} beside an idle shard; {} claims past their budget",
        seen.claims_detached
    );
}

/// One producer, a buffer of two claims, two slots of 50 ms jobs (40
/// jobs/s): a batch lasts 1.25 s in the slots, so a late reply usually
/// finds the buffer full.
const TIGHT_BUFFER: &str = "
[dequeue]
batch_size = 50
[worker]
queues = [\"slow\"]
producers = 1
buffer_jobs = 100
concurrency = 2
";

/// `worker.buffer_jobs` of [`TIGHT_BUFFER`].
const BUFFER_JOBS: i64 = 100;

/// Rows of finished jobs that may still read `running` while their outcome
/// is being written (two slots of 50 ms jobs finish a few per write).
const OUTCOMES_IN_WRITING: i64 = 10;

/// Jobs in the tight-buffer test: ~7.5 s of the slots' time.
const TIGHT_JOBS: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_of_late_claim_replies_run_and_no_row_is_rewritten() {
    // Only the claims are slow (the horizon case: a probe touches no table
    // and answers at once); each of them answers past its budget.
    let (_shards, set, _proxy, through) = slow_shard(
        TIGHT_BUFFER,
        TIGHT_JOBS,
        "sleep",
        serde_json::json!({ "ms": 50 }),
        Some(JOB_CLAIM),
    )
    .await;
    let worker = Worker::new(
        through.clone(),
        ShardSet::connect(&through).expect("pools"),
        HandlerRegistry::with_builtins(),
    );
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let drained = drain(set.get(0), DRAIN_LIMIT).await;
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the worker stops")
        .expect("worker");
    let seen = report.stats;
    // A job claimed more than once had its row written back to queued in
    // between (a release, or a lease taken back): each is a dead version.
    let db = set.get(0).client().await.expect("client");
    let reclaimed: i64 = db
        .query_one("SELECT count(*) FROM workflow_status WHERE fence > 1", &[])
        .await
        .expect("count")
        .get(0);
    eprintln!(
        "drained in {:?}; {} claims past their budget; {} jobs given back; {reclaimed} jobs \
         claimed more than once; at most {} jobs claimed at once",
        drained.took, seen.claims_detached, seen.released, drained.most_claimed
    );
    assert!(
        drained.took.is_some(),
        "jobs left after {DRAIN_LIMIT:?}; worker {seen:?}"
    );
    assert!(
        seen.claims_detached > 0,
        "no claim ran past its budget: the test shows nothing"
    );
    assert_eq!(
        seen.released, 0,
        "jobs of late claim replies were given back (their rows rewritten)"
    );
    assert_eq!(reclaimed, 0, "jobs were claimed again after a give-back");
    // Late replies keep to the buffer: they wait for room rather than the
    // producer claiming past it (which would take a whole batch of 50 more).
    // A job's room comes back as its outcome reaches the completer, a moment
    // before its row is written: those few rows still read `running`.
    assert!(
        drained.most_claimed <= BUFFER_JOBS + OUTCOMES_IN_WRITING,
        "{} jobs claimed at once, with a buffer of {BUFFER_JOBS}",
        drained.most_claimed
    );
}
