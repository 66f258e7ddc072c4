//! The limits' home shard (the first) refusing connections when a worker
//! starts: the worker learns from the other shard which queues have no
//! limit and runs their jobs there; a limited queue's jobs wait (its limit
//! cannot be counted) and run once the home shard answers again.

use crate::common;

use common::{wait_until, TestShards};
use shardq::client::QueueLimits;
use shardq::shards::ShardSet;
use shardq::{Client, HandlerRegistry, NewJob, Worker, WorkerReport};
use shardq_harness::lossy_proxy::{Fault, LossyProxy};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const SETTINGS: &str = "
[worker]
queues = [\"free\", \"capped\"]
";

/// Succeeded jobs of `queue` on shard `shard`.
async fn succeeded(set: &ShardSet, shard: usize, queue: &str) -> i64 {
    let db = set.get(shard).client().await.expect("connection");
    db.query_one(
        "SELECT count(*) FROM workflow_status WHERE queue = $1 AND status = 'succeeded'",
        &[&queue],
    )
    .await
    .expect("count")
    .get(0)
}

async fn on_shard(set: &ShardSet, shard: usize, queue: &str) -> i64 {
    let db = set.get(shard).client().await.expect("connection");
    db.query_one(
        "SELECT count(*) FROM workflow_status WHERE queue = $1",
        &[&queue],
    )
    .await
    .expect("count")
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_starting_while_the_home_shard_refuses_runs_the_unlimited_queues() {
    let shards = TestShards::servers(2).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let capped = QueueLimits {
        concurrency: Some(2),
        ..QueueLimits::default()
    };
    client.set_queue_limits("capped", capped).await.unwrap();
    for queue in ["free", "capped"] {
        let jobs = (0..40)
            .map(|i| NewJob::new(queue, "noop", serde_json::json!({ "i": i })))
            .collect();
        client.enqueue_many(jobs).await.unwrap();
    }
    assert!(on_shard(&set, 1, "free").await > 0 && on_shard(&set, 1, "capped").await > 0);

    let home = &shards.urls[0];
    let proxy = LossyProxy::start(shardq_harness::lossy_proxy::server_addr(home));
    proxy.set_fault(Fault::Refuse);
    let mut urls = shards.urls.clone();
    urls[0] = home.replace(
        &shardq_harness::lossy_proxy::server_addr(home).to_string(),
        &proxy.addr().to_string(),
    );
    let worker_config = TestShards {
        servers: Vec::new(),
        urls,
    }
    .config(SETTINGS);
    let worker = Worker::new(
        worker_config.clone(),
        ShardSet::connect(&worker_config).expect("pools"),
        HandlerRegistry::with_builtins(),
    );
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));

    let free_on_1 = on_shard(&set, 1, "free").await;
    wait_until(
        Duration::from_secs(30),
        "the unlimited queue's jobs on the healthy shard ran",
        || async { succeeded(&set, 1, "free").await == free_on_1 },
    )
    .await;
    assert_eq!(
        succeeded(&set, 1, "capped").await,
        0,
        "the limited queue's jobs wait while its limit cannot be counted"
    );

    proxy.set_fault(Fault::None);
    let capped_on_1 = on_shard(&set, 1, "capped").await;
    wait_until(
        Duration::from_secs(30),
        "the limited queue's jobs ran once the home shard answered",
        || async { succeeded(&set, 1, "capped").await == capped_on_1 },
    )
    .await;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the worker stops")
        .expect("worker");
}

/// Settings of the two processes sharing the limited queue.
const SHARED: &str = "[worker]\nqueues = [\"capped\"]\nconcurrency = 16\n";

/// Two servers, `capped` limited to 5, `jobs` one-second jobs enqueued, and
/// a proxy in front of the home shard whose delays hold only the replies to
/// permit asks; returns the shards, the proxy and the config through it.
async fn slow_permit_replies(jobs: i64) -> (TestShards, ShardSet, LossyProxy, shardq::Config) {
    let shards = TestShards::servers(2).await;
    let config = shards.config(SHARED);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let capped = QueueLimits {
        concurrency: Some(5),
        ..QueueLimits::default()
    };
    client.set_queue_limits("capped", capped).await.unwrap();
    let jobs = (0..jobs)
        .map(|i| {
            NewJob::new(
                "capped",
                "sleep",
                serde_json::json!({ "ms": 1_000, "i": i }),
            )
        })
        .collect();
    client.enqueue_many(jobs).await.unwrap();
    let home = &shards.urls[0];
    let proxy = LossyProxy::start(shardq_harness::lossy_proxy::server_addr(home));
    proxy.set_delay_only(Some("shardq_lease_permits"));
    let mut urls = shards.urls.clone();
    urls[0] = home.replace(
        &shardq_harness::lossy_proxy::server_addr(home).to_string(),
        &proxy.addr().to_string(),
    );
    let slow = TestShards {
        servers: Vec::new(),
        urls,
    }
    .config(SHARED);
    (shards, set, proxy, slow)
}

fn start(config: &shardq::Config, stop: &CancellationToken) -> JoinHandle<WorkerReport> {
    let worker = Worker::new(
        config.clone(),
        ShardSet::connect(config).expect("pools"),
        HandlerRegistry::with_builtins(),
    );
    tokio::spawn(worker.run(stop.clone()))
}

async fn stop_all(stop: CancellationToken, workers: Vec<JoinHandle<WorkerReport>>) {
    stop.cancel();
    for worker in workers {
        tokio::time::timeout(Duration::from_secs(30), worker)
            .await
            .expect("the worker stops")
            .expect("worker");
    }
}

async fn capped_done(set: &ShardSet) -> i64 {
    succeeded(set, 0, "capped").await + succeeded(set, 1, "capped").await
}

/// The most jobs of `capped` that ran at once.
async fn capped_at_once(set: &ShardSet) -> usize {
    let mut spans = Vec::new();
    for shard in set.all() {
        let db = shard.client().await.unwrap();
        for row in db
            .query(
                "SELECT started_at, finished_at FROM workflow_status WHERE queue = 'capped'",
                &[],
            )
            .await
            .unwrap()
        {
            spans.push((row.get(0), row.get(1)));
        }
    }
    crate::queue_limits::most_at_once(&spans)
}

/// Two processes share a queue limited to 5. A runs its jobs, then the home
/// shard's replies to A's permit asks start taking 3 s, three times the
/// ask's deadline; each ask still commits there. B starts. A's lease lapses
/// 5 s after its last answer. A must not keep the
/// permits it can no longer use from B (before the fix: A's lapsed lease
/// made it ask for more each time, the home shard kept renewing A's row at
/// the full limit and granted B none: the queue froze), and the limit
/// still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_whose_permit_replies_are_slow_does_not_freeze_a_limited_queue() {
    const JOBS: i64 = 60;
    let (shards, set, proxy, slow_config) = slow_permit_replies(JOBS).await;
    let stop = CancellationToken::new();
    let slow = start(&slow_config, &stop);
    wait_until(Duration::from_secs(30), "A runs jobs", || async {
        capped_done(&set).await >= 3
    })
    .await;
    proxy.set_fault(Fault::Delay(Duration::from_secs(3)));
    let fast = start(&shards.config(SHARED), &stop);
    wait_until(
        Duration::from_secs(60),
        "every job of the limited queue ran",
        || async { capped_done(&set).await == JOBS },
    )
    .await;
    proxy.set_fault(Fault::None);
    stop_all(stop, vec![slow, fast]).await;
    let most = capped_at_once(&set).await;
    assert!(most <= 5, "{most} jobs of the limited queue ran at once");
}

/// The case: A's permit replies take 3 s from its start, three
/// times the ask's deadline, so it never hears one; its first ask, for all
/// it can hold, committed all the same and holds the whole limit of 5 when
/// B starts. B must run the queue's jobs, the limit held (before the fix:
/// A, never told the limit, asked for everything again each time, the home
/// shard renewed its row at the full limit and B ran none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_never_answered_in_time_does_not_hold_a_limited_queue() {
    const JOBS: i64 = 20;
    let (shards, set, proxy, slow_config) = slow_permit_replies(JOBS).await;
    proxy.set_fault(Fault::Delay(Duration::from_secs(3)));
    let stop = CancellationToken::new();
    let slow = start(&slow_config, &stop);
    wait_until(
        Duration::from_secs(30),
        "A's first ask holds the limit on the home shard",
        || async { capped_leases(&set).await > 0 },
    )
    .await;
    let fast = start(&shards.config(SHARED), &stop);
    // B alone runs the 20 jobs in about 4 s; the bound is for a loaded
    // machine (before the fix B ran none however long it waited).
    wait_until(
        Duration::from_secs(40),
        "B ran every job of the limited queue",
        || async { capped_done(&set).await == JOBS },
    )
    .await;
    proxy.set_fault(Fault::None);
    stop_all(stop, vec![slow, fast]).await;
    let most = capped_at_once(&set).await;
    assert!(most <= 5, "{most} jobs of the limited queue ran at once");
}

/// Holders of `capped`'s permit leases on the home shard.
async fn capped_leases(set: &ShardSet) -> i64 {
    let db = set.get(0).client().await.expect("connection");
    db.query_one(
        "SELECT count(*) FROM shardq_limit_holders WHERE queue = 'capped'",
        &[],
    )
    .await
    .expect("count")
    .get(0)
}
