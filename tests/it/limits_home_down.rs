//! The limits' home shard (the first) refusing connections when a worker
//! starts: the worker learns from the other shard which queues have no
//! limit and runs their jobs there; a limited queue's jobs wait (its limit
//! cannot be counted) and run once the home shard answers again.

use crate::common;

use common::{wait_until, TestShards};
use shardq::client::QueueLimits;
use shardq::shards::ShardSet;
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use shardq_harness::lossy_proxy::{Fault, LossyProxy};
use std::time::Duration;
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
    let shards = TestShards::servers(2).await;
    let settings = "[worker]\nqueues = [\"capped\"]\nconcurrency = 16\n";
    let config = shards.config(settings);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let capped = QueueLimits {
        concurrency: Some(5),
        ..QueueLimits::default()
    };
    client.set_queue_limits("capped", capped).await.unwrap();
    let jobs = (0..JOBS)
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
    let mut urls = shards.urls.clone();
    urls[0] = home.replace(
        &shardq_harness::lossy_proxy::server_addr(home).to_string(),
        &proxy.addr().to_string(),
    );
    let slow_config = TestShards {
        servers: Vec::new(),
        urls,
    }
    .config(settings);
    let stop = CancellationToken::new();
    let start = |config: shardq::Config| {
        let worker = Worker::new(
            config.clone(),
            ShardSet::connect(&config).expect("pools"),
            HandlerRegistry::with_builtins(),
        );
        tokio::spawn(worker.run(stop.clone()))
    };
    let done = || async { succeeded(&set, 0, "capped").await + succeeded(&set, 1, "capped").await };
    let slow = start(slow_config);
    wait_until(Duration::from_secs(30), "A runs jobs", || async {
        done().await >= 3
    })
    .await;
    proxy.set_delay_only(Some("shardq_lease_permits"));
    proxy.set_fault(Fault::Delay(Duration::from_secs(3)));
    let fast = start(config.clone());
    wait_until(
        Duration::from_secs(60),
        "every job of the limited queue ran",
        || async { done().await == JOBS },
    )
    .await;
    stop.cancel();
    proxy.set_fault(Fault::None);
    for worker in [slow, fast] {
        tokio::time::timeout(Duration::from_secs(30), worker)
            .await
            .expect("the worker stops")
            .expect("worker");
    }
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
    let most = crate::queue_limits::most_at_once(&spans);
    assert!(most <= 5, "{most} jobs of the limited queue ran at once");
}
