//! Bad input gets a clear error and loses nothing: oversized or invalid
//! payloads, hostile names, handlers that panic or never return.

use crate::common;

use common::TestShards;
use shardq::client::JobOutcome;
use shardq::{Client, ClientError, HandlerRegistry, NewJob, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const HOSTILE_QUEUE: &str = "q'; DROP TABLE workflow_status; --";
const HOSTILE_HANDLER: &str = "h\"x'); DELETE FROM workflow_status; --";
const HOSTILE_KEY: &str = "k$1 \\' OR 1=1 --";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_nul_payloads_and_nul_names_are_rejected_before_writing() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("[limits]\nmax_payload_bytes = 100\n");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let good = NewJob::new("q", "noop", serde_json::json!({"ok": 1}));
    let cases = [
        (
            NewJob::new("q", "noop", serde_json::json!({ "blob": "x".repeat(200) })),
            "over limits.max_payload_bytes = 100",
        ),
        (
            NewJob::new("q", "noop", serde_json::json!({ "s": "a\u{0}b" })),
            "NUL character",
        ),
        (
            NewJob::new("q\u{0}", "noop", serde_json::json!({})),
            "queue contains a NUL",
        ),
        (
            NewJob::new("", "noop", serde_json::json!({})),
            "queue name is empty",
        ),
        (
            good.clone().ordering_key("k\u{0}"),
            "ordering key contains a NUL",
        ),
        (good.clone().max_attempts(0), "at least 1"),
    ];
    for (bad, message) in cases {
        // A good job first in the same batch: the whole batch is refused.
        match client.enqueue_many(vec![good.clone(), bad]).await {
            Err(ClientError::Invalid { index: 1, reason }) => {
                assert!(reason.to_string().contains(message), "{reason}")
            }
            other => panic!("expected a rejection with `{message}`, got {other:?}"),
        }
    }
    assert_eq!(
        common::count_status(&set, "queued").await,
        0,
        "nothing was written"
    );
    // A backslash-u sequence that is not a NUL is fine.
    client
        .enqueue(NewJob::new(
            "q",
            "noop",
            serde_json::json!({ "s": "\\u0000" }),
        ))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_are_stored_and_routed_as_data() {
    let shards = TestShards::databases(2).await;
    let config = shards.config(&format!("[worker]\nqueues = [{HOSTILE_QUEUE:?}]\n"));
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let id = client
        .enqueue(
            NewJob::new(
                HOSTILE_QUEUE,
                HOSTILE_HANDLER,
                serde_json::json!({"q": "'; --"}),
            )
            .ordering_key(HOSTILE_KEY),
        )
        .await
        .unwrap();
    assert_eq!(id.shard_key, shardq::router::shard_key_for(HOSTILE_KEY));
    let mut registry = HandlerRegistry::with_builtins();
    registry.register(HOSTILE_HANDLER, |ctx| async move { Ok(ctx.payload) });
    let report = Worker::new(config, set.clone(), registry)
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    assert_eq!(report.stats.succeeded, 1);
    let info = client.job(id).await.unwrap().unwrap();
    assert_eq!(
        (info.queue.as_str(), info.handler.as_str()),
        (HOSTILE_QUEUE, HOSTILE_HANDLER)
    );
    assert_eq!(info.ordering_key.as_deref(), Some(HOSTILE_KEY));
    assert_eq!(info.output, Some(serde_json::json!({"q": "'; --"})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_job_and_the_worker_keeps_running() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("[worker]\nqueues = [\"q\"]\n");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("explode", |_ctx| async { panic!("kaboom in the handler") });
    let bad = client
        .enqueue(NewJob::new("q", "explode", serde_json::json!({})).max_attempts(1))
        .await
        .unwrap();
    let jobs = (0..50)
        .map(|_| NewJob::new("q", "noop", serde_json::json!({})))
        .collect();
    client.enqueue_many(jobs).await.unwrap();
    let report = Worker::new(config, set, registry)
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    assert_eq!(
        report.stats.succeeded, 50,
        "the worker went on after the panic"
    );
    match client.result(bad, Duration::from_secs(5)).await.unwrap() {
        JobOutcome::Dead(error) => assert!(
            error.contains("handler panicked: kaboom in the handler"),
            "{error}"
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_never_returns_is_abandoned_and_its_job_retried() {
    let shards = TestShards::databases(1).await;
    let config = shards.config(
        "[worker]\nqueues = [\"q\"]\nhandler_timeout_ms = 300\nretry_backoff_min_ms = 10\nretry_backoff_max_ms = 20\nmaintenance_interval_ms = 50\n",
    );
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("stuck-once", |ctx| async move {
        if ctx.attempt == 1 {
            std::future::pending::<()>().await;
        }
        Ok(serde_json::json!("second time lucky"))
    });
    let id = client
        .enqueue(NewJob::new("q", "stuck-once", serde_json::json!({})))
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(Worker::new(config, set, registry).run(stop.clone()));
    let outcome = client.result(id, Duration::from_secs(30)).await.unwrap();
    stop.cancel();
    let report = worker.await.unwrap();
    assert_eq!(
        outcome,
        JobOutcome::Succeeded(serde_json::json!("second time lucky"))
    );
    assert_eq!(report.stats.abandoned, 1);
    assert_eq!(client.job(id).await.unwrap().unwrap().attempts, 2);
}
