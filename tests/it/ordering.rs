//! Per-key ordering: five revisions of each of 200 keys, queued back to back,
//! run by two worker processes with 16 executor slots each. Per key, handler
//! calls never overlap and run in enqueue order.
//!
//! The second process is this test binary run again with `SHARDQ_TEST_ROLE`
//! set, so both workers are real OS processes with the same handler.

use crate::common;

use common::{child_test, micros, TestShards};
use shardq::shards::ShardSet;
use shardq::{Client, Config, HandlerRegistry, NewJob, Worker};
use std::collections::HashMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const KEYS: usize = 200;
const REVISIONS: i32 = 5;

const WORKER_TOML: &str = "
[dequeue]
batch_size = 100
empty_backoff_min_ms = 5
empty_backoff_max_ms = 20
[worker]
queues = [\"ordered\"]
concurrency = 16
";

const CALLS_TABLE: &str = "CREATE TABLE IF NOT EXISTS test_calls \
    (key text, revision int, started_us bigint, finished_us bigint, pid int)";

/// A handler that takes a little while and records when it ran, in the
/// job's own shard (one call = one row).
fn recording_registry(shards: ShardSet) -> HandlerRegistry {
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("record", move |ctx| {
        let shards = shards.clone();
        async move {
            let started = micros();
            tokio::time::sleep(Duration::from_millis(1 + (ctx.id.id % 3) as u64)).await;
            let finished = micros();
            let revision = ctx.payload["revision"].as_i64().unwrap_or(-1) as i32;
            let client = shards.for_key(ctx.id.shard_key).client().await?;
            client
                .execute(
                    "INSERT INTO test_calls VALUES ($1, $2, $3, $4, $5)",
                    &[
                        &ctx.ordering_key,
                        &revision,
                        &started,
                        &finished,
                        &(std::process::id() as i32),
                    ],
                )
                .await?;
            Ok(serde_json::Value::Null)
        }
    });
    registry
}

async fn run_worker(config: Config) -> shardq::WorkerReport {
    let shards = ShardSet::connect(&config).unwrap();
    Worker::new(config, shards.clone(), recording_registry(shards))
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await
}

/// The second worker process; does nothing in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_second_worker_process() {
    if let Some(config) = child_test::config_as("worker") {
        run_worker(config).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_one_key_never_overlap_and_run_in_enqueue_order() {
    if child_test::is_child() {
        return;
    }
    let shards = TestShards::databases(2).await;
    let toml = shards.toml(WORKER_TOML);
    let config = Config::from_toml(&toml).unwrap();
    let set = shards.migrated(&config).await;
    for shard in set.all() {
        shard
            .client()
            .await
            .unwrap()
            .batch_execute(CALLS_TABLE)
            .await
            .unwrap();
    }
    // Revisions of each key back to back: 0..5 of key 0, then of key 1, ...
    let jobs: Vec<NewJob> = (0..KEYS)
        .flat_map(|k| {
            (0..REVISIONS).map(move |r| {
                NewJob::new("ordered", "record", serde_json::json!({ "revision": r }))
                    .ordering_key(format!("key-{k}"))
            })
        })
        .collect();
    Client::from_shards(set.clone(), config.limits.clone())
        .enqueue_many(jobs)
        .await
        .unwrap();

    let other = child_test::spawn("ordering::ordering_second_worker_process", "worker", &toml);
    let here = run_worker(config).await;
    let status = tokio::time::timeout(Duration::from_secs(120), other.wait_with_output())
        .await
        .expect("second worker exits")
        .unwrap()
        .status;
    assert!(status.success());
    assert!(here.stats.succeeded > 0, "this process ran jobs too");

    let mut calls: HashMap<String, Vec<(i64, i64, i32, i32)>> = HashMap::new();
    let mut pids = std::collections::HashSet::new();
    for shard in set.all() {
        let rows = shard
            .client()
            .await
            .unwrap()
            .query(
                "SELECT key, revision, started_us, finished_us, pid FROM test_calls",
                &[],
            )
            .await
            .unwrap();
        for r in rows {
            pids.insert(r.get::<_, i32>(4));
            calls
                .entry(r.get(0))
                .or_default()
                .push((r.get(2), r.get(3), r.get(1), r.get(4)));
        }
    }
    assert_eq!(pids.len(), 2, "both processes ran jobs");
    assert_eq!(calls.len(), KEYS);
    for (key, mut runs) in calls {
        runs.sort();
        let revisions: Vec<i32> = runs.iter().map(|r| r.2).collect();
        assert_eq!(
            revisions,
            (0..REVISIONS).collect::<Vec<_>>(),
            "key {key} ran out of order: {runs:?}"
        );
        for pair in runs.windows(2) {
            assert!(pair[1].0 >= pair[0].1, "key {key}: calls overlap: {pair:?}");
        }
    }
    // The recorded finish times follow each key's order too (users check
    // order by them): a key's outcomes are written one write after another.
    for shard in set.all() {
        let backwards: i64 = shard
            .client()
            .await
            .unwrap()
            .query_one(
                "SELECT count(*) FROM (SELECT finished_at < lag(finished_at) \
                     OVER (PARTITION BY ordering_key ORDER BY id) AS backwards \
                 FROM workflow_status WHERE queue = 'ordered') runs WHERE backwards",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            backwards, 0,
            "{}: a key's later job finished first",
            shard.name
        );
    }
}

/// A keyed job fails with attempts left in the middle of a claimed run. The
/// executor must hold the rest of the run back (release it) so that the key's
/// later jobs run only after the failed one's retry succeeded. Before, the
/// slot ran them at once, right after the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_inside_a_run_holds_back_the_rest_of_its_key() {
    if child_test::is_child() {
        return;
    }
    let shards = TestShards::databases(1).await;
    let config = shards.config(
        "[dequeue]\nbatch_size = 100\nempty_backoff_min_ms = 5\nempty_backoff_max_ms = 20\n\
         [worker]\nqueues = [\"ordered\"]\nconcurrency = 4\nmaintenance_interval_ms = 50\n\
         retry_backoff_min_ms = 300\nretry_backoff_max_ms = 300\n",
    );
    let set = shards.migrated(&config).await;
    let db = set.get(0).client().await.unwrap();
    db.batch_execute(CALLS_TABLE).await.unwrap();
    let jobs = (0..4)
        .map(|r| {
            NewJob::new("ordered", "flaky", serde_json::json!({ "revision": r })).ordering_key("K")
        })
        .collect();
    Client::from_shards(set.clone(), config.limits.clone())
        .enqueue_many(jobs)
        .await
        .unwrap();

    // Revision 1 fails on its first attempt; every call is recorded.
    let mut registry = HandlerRegistry::with_builtins();
    let calls = set.clone();
    registry.register("flaky", move |ctx| {
        let shards = calls.clone();
        async move {
            let revision = ctx.payload["revision"].as_i64().unwrap() as i32;
            let client = shards.for_key(ctx.id.shard_key).client().await?;
            client
                .execute(
                    "INSERT INTO test_calls VALUES ($1, $2, $3, $3, $4)",
                    &[&ctx.ordering_key, &revision, &micros(), &ctx.attempt],
                )
                .await?;
            if revision == 1 && ctx.attempt == 1 {
                return Err("first attempt of revision 1 fails".to_string().into());
            }
            Ok(serde_json::Value::Null)
        }
    });
    let report = tokio::time::timeout(
        Duration::from_secs(60),
        Worker::new(config, set.clone(), registry)
            .stop_when_empty(true)
            .run(CancellationToken::new()),
    )
    .await
    .expect("drained");
    assert_eq!(report.stats.succeeded, 4);
    assert!(report.stats.released >= 2, "the run's tail was released");

    let rows = db
        .query(
            "SELECT revision, pid FROM test_calls ORDER BY started_us",
            &[],
        )
        .await
        .unwrap();
    let order: Vec<(i32, i32)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        order,
        vec![(0, 1), (1, 1), (1, 2), (2, 1), (3, 1)],
        "(revision, attempt) in call order"
    );
}
