//! Ordering is per (queue, key): one worker serving two queues, the same key
//! string in both. A failed job of queue A holds back the rest of its run
//! (A's later jobs of that key, claimed with it) until its retry has run,
//! even when a job of queue B with the same key string reaches the same
//! executor slot in between.
//!
//! The interleaving is driven, not hoped for: executor slots hold one job
//! each (`buffer_jobs = concurrency`), so the producer that claimed A's run
//! waits at the slot after each job; the second producer claims B's job while
//! A1's handler is held, and queues behind it at the same slot (a slot's
//! queue admits waiting producers in turn). So B's job reaches the slot
//! between A's jobs.

use crate::common;

use common::{wait_until, TestShards};
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const KEY: &str = "shared-key";
/// A's run: A1 fails once, then A2..A4 must follow its retry.
const RUN: usize = 4;

const WORKER_TOML: &str = "
[dequeue]
batch_size = 4
[worker]
queues = [\"a\", \"b\"]
concurrency = 8
producers = 2
buffer_jobs = 8
retry_backoff_min_ms = 300
retry_backoff_max_ms = 300
";

/// Handler calls as (job name, attempt); A1's first attempt waits for `gate`
/// and fails.
fn registry(
    calls: Arc<Mutex<Vec<(String, i32)>>>,
    started: Arc<Notify>,
    gate: Arc<Notify>,
) -> HandlerRegistry {
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("record", move |ctx| {
        let (calls, started, gate) = (calls.clone(), started.clone(), gate.clone());
        async move {
            let name = ctx.payload["name"].as_str().unwrap_or_default().to_string();
            calls.lock().unwrap().push((name.clone(), ctx.attempt));
            if name == "a1" && ctx.attempt == 1 {
                started.notify_one();
                gate.notified().await;
                return Err("a1 fails its first attempt".into());
            }
            Ok(serde_json::Value::Null)
        }
    });
    registry
}

fn job(queue: &str, name: &str) -> NewJob {
    NewJob::new(queue, "record", serde_json::json!({ "name": name })).ordering_key(KEY)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_holds_while_another_queue_uses_the_same_key_string() {
    let shards = TestShards::databases(1).await;
    let config = shards.config(WORKER_TOML);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let run: Vec<NewJob> = (1..=RUN).map(|i| job("a", &format!("a{i}"))).collect();
    client.enqueue_many(run).await.unwrap();

    let calls = Arc::new(Mutex::new(Vec::new()));
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let shutdown = CancellationToken::new();
    let worker = Worker::new(
        config.clone(),
        set.clone(),
        registry(calls.clone(), started.clone(), gate.clone()),
    );
    let running = tokio::spawn(worker.run(shutdown.clone()));

    // A1 runs (its run of four came in one claim); then B's job of the same
    // key string is claimed by the other producer.
    tokio::time::timeout(Duration::from_secs(30), started.notified())
        .await
        .expect("a1 starts");
    client.enqueue(job("b", "b1")).await.unwrap();
    wait_until(Duration::from_secs(30), "b1 is claimed", || async {
        let db = set.get(0).client().await.unwrap();
        let claimed: i64 = db
            .query_one(
                "SELECT count(*) FROM workflow_status WHERE queue = 'b' \
                 AND status IN ('running', 'succeeded')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        claimed == 1
    })
    .await;
    // Let the second producer reach the slot's queue.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.notify_one();

    wait_until(Duration::from_secs(60), "every job succeeded", || async {
        common::count_status(&set, "succeeded").await == 1 + RUN as i64
    })
    .await;
    shutdown.cancel();
    running.await.unwrap();

    let calls = calls.lock().unwrap().clone();
    let of_a: Vec<&str> = calls
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|name| name.starts_with('a'))
        .collect();
    let expected = vec!["a1", "a1", "a2", "a3", "a4"];
    assert_eq!(
        of_a, expected,
        "queue a's key ran out of order (all calls: {calls:?})"
    );
}
