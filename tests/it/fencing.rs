//! Fencing: a job whose lease expired while its handler was still running is
//! re-claimed by another worker; the first worker's late completion is
//! rejected, and the job's final state is the second attempt's.

use crate::common;

use common::{wait_until, TestShards};
use shardq::store::upkeep;
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_completion_after_a_lost_lease_is_fenced_out() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("[worker]\nqueues = [\"f\"]\nmaintenance_interval_ms = 3600000\n");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let id = client
        .enqueue(NewJob::new("f", "two-attempts", serde_json::json!({})))
        .await
        .unwrap();

    // Attempt 1 blocks until released; attempt 2 returns at once.
    let release_first = Arc::new(Notify::new());
    let mut registry = HandlerRegistry::with_builtins();
    let gate = release_first.clone();
    registry.register("two-attempts", move |ctx| {
        let gate = gate.clone();
        async move {
            if ctx.attempt == 1 {
                gate.notified().await;
            }
            Ok(serde_json::json!({ "attempt": ctx.attempt }))
        }
    });

    // The first worker, once it has found the queue empty, looks again only
    // after 30 s, so the recovered job goes to the second worker.
    let first_config = shards.config(
        "[dequeue]\nempty_backoff_min_ms = 30000\nempty_backoff_max_ms = 30000\n\
         [worker]\nqueues = [\"f\"]\nmaintenance_interval_ms = 3600000\n",
    );
    let first = Worker::new(
        first_config.clone(),
        shardq::shards::ShardSet::connect(&first_config).unwrap(),
        registry.clone(),
    );
    let first_stats = first.stats();
    let first_stop = CancellationToken::new();
    let first_run = tokio::spawn(first.run(first_stop.clone()));
    wait_until(
        Duration::from_secs(20),
        "attempt 1 claimed, queue seen empty by both producers",
        || {
            let s = first_stats.clone();
            async move { s.snapshot().claimed == 1 && s.snapshot().empty >= 2 }
        },
    )
    .await;

    // The lease runs out (as if the first worker had hung) and recovery returns the job.
    let shard = set.for_key(id.shard_key);
    shard
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
            &[&id.id],
        )
        .await
        .unwrap();
    assert_eq!(
        upkeep::recover_expired(shard, 10).await.unwrap().requeued,
        1
    );

    let second = Worker::new(
        config.clone(),
        shardq::shards::ShardSet::connect(&config).unwrap(),
        registry,
    )
    .stop_when_empty(true)
    .run(CancellationToken::new())
    .await;
    assert_eq!(second.stats.succeeded, 1, "the second attempt completed");

    release_first.notify_one();
    wait_until(Duration::from_secs(20), "late completion processed", || {
        let s = first_stats.clone();
        async move { s.snapshot().fenced == 1 }
    })
    .await;
    first_stop.cancel();
    let first_report = first_run.await.unwrap();
    assert_eq!(
        first_report.stats.succeeded, 0,
        "the late completion was not written"
    );

    let row = shard
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT status, output, attempts FROM workflow_status WHERE id = $1",
            &[&id.id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "succeeded");
    assert_eq!(
        row.get::<_, serde_json::Value>(1),
        serde_json::json!({ "attempt": 2 })
    );
    assert_eq!(row.get::<_, i32>(2), 2);
}
