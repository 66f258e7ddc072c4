//! Crash recovery: a worker process is SIGKILLed in the middle of a three-step
//! workflow. After its lease expires another process completes the workflow,
//! and the side effect of each step that had completed before the kill
//! happened exactly once.
//!
//! The killed worker is this test binary run again with `SHARDQ_TEST_ROLE`.

use crate::common;

use common::{child_test, wait_until, TestShards};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use shardq::shards::ShardSet;
use shardq::{Client, Config, HandlerRegistry, NewJob, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A short lease so the dead worker's claim expires quickly.
const WORKER_TOML: &str = "
[dequeue]
empty_backoff_min_ms = 5
empty_backoff_max_ms = 20
[worker]
queues = [\"wf\"]
lease_ms = 1500
maintenance_interval_ms = 200
";

/// Three steps, each recording its side effect in `test_effects`. On the
/// first attempt the handler stalls after step 2, waiting to be killed.
fn three_steps(shards: ShardSet) -> HandlerRegistry {
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("three", move |ctx| {
        let shards = shards.clone();
        async move {
            for step in ["one", "two", "three"] {
                if step == "three" && ctx.attempt == 1 {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                let shards = shards.clone();
                let id = ctx.id;
                ctx.step(step, || async move {
                    let db = shards.for_key(id.shard_key).client().await?;
                    db.execute("INSERT INTO test_effects VALUES ($1, $2)", &[&id.id, &step])
                        .await?;
                    Ok(step.to_string())
                })
                .await?;
            }
            Ok(serde_json::json!("done"))
        }
    });
    registry
}

/// The worker that gets killed; does nothing in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_recovery_doomed_worker_process() {
    let Some(config) = child_test::config_as("doomed") else {
        return;
    };
    let shards = ShardSet::connect(&config).unwrap();
    Worker::new(config, shards.clone(), three_steps(shards))
        .run(CancellationToken::new())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workflow_resumes_elsewhere_without_repeating_completed_steps() {
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
            .batch_execute("CREATE TABLE test_effects (job bigint, step text)")
            .await
            .unwrap();
    }
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let id = client
        .enqueue(NewJob::new("wf", "three", serde_json::json!({})))
        .await
        .unwrap();
    let shard = set.for_key(id.shard_key).clone();

    let mut doomed = child_test::spawn(
        "crash_recovery::crash_recovery_doomed_worker_process",
        "doomed",
        &toml,
    );
    let probe = shard.clone();
    wait_until(
        Duration::from_secs(30),
        "steps one and two recorded",
        || {
            let shard = probe.clone();
            async move {
                let db = shard.client().await.unwrap();
                let n: i64 = db
                    .query_one("SELECT count(*) FROM workflow_steps", &[])
                    .await
                    .unwrap()
                    .get(0);
                n == 2
            }
        },
    )
    .await;
    kill(Pid::from_raw(doomed.id().unwrap() as i32), Signal::SIGKILL).unwrap();
    doomed.wait().await.unwrap();

    let survivor = Worker::new(
        config.clone(),
        ShardSet::connect(&config).unwrap(),
        three_steps(set.clone()),
    );
    let stop = CancellationToken::new();
    let running = tokio::spawn(survivor.run(stop.clone()));
    let outcome = client.result(id, Duration::from_secs(60)).await.unwrap();
    stop.cancel();
    let report = running.await.unwrap();
    assert_eq!(
        outcome,
        shardq::client::JobOutcome::Succeeded(serde_json::json!("done"))
    );
    assert!(report.stats.recovered >= 1 || report.stats.succeeded == 1);

    let db = shard.client().await.unwrap();
    let rows = db
        .query(
            "SELECT step, count(*) FROM test_effects GROUP BY step ORDER BY step",
            &[],
        )
        .await
        .unwrap();
    let effects: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        effects,
        vec![("one".into(), 1), ("three".into(), 1), ("two".into(), 1)],
        "each step's side effect happened exactly once"
    );
    let attempts: i32 = db
        .query_one(
            "SELECT attempts FROM workflow_status WHERE id = $1",
            &[&id.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempts, 2, "the second attempt finished it");
}
