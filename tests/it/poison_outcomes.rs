//! Outcomes the database cannot store never wedge the completer: a NUL in an
//! output or an error text, and a row that a constraint rejects, fail only
//! their own job; the rest of the batch is written and the worker keeps
//! claiming on every shard. Before, the whole batch's write failed and was
//! retried forever, and the process stopped claiming everywhere.

use crate::common;

use common::TestShards;
use serde_json::json;
use shardq::client::JobOutcome;
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const WORKER: &str = "
[dequeue]
batch_size = 50
empty_backoff_min_ms = 5
empty_backoff_max_ms = 20
[worker]
queues = [\"q\"]
completion_batch = 100
completion_flush_ms = 50
";

fn registry() -> HandlerRegistry {
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("nul-output", |_ctx| async { Ok(json!({ "s": "a\u{0}b" })) });
    registry.register("nul-error", |_ctx| async {
        Err("bad \u{0} byte".to_string().into())
    });
    registry.register("refused", |_ctx| async { Ok(json!({ "poison": true })) });
    registry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unstorable_outcomes_fail_their_own_job_and_the_rest_is_written() {
    let shards = TestShards::databases(2).await;
    let config = shards.config(WORKER);
    let set = shards.migrated(&config).await;
    // A rule of the user's that the database enforces on outputs (SQLSTATE 23514).
    for shard in set.all() {
        shard
            .client()
            .await
            .unwrap()
            .batch_execute(
                "ALTER TABLE workflow_status ADD CONSTRAINT no_poison \
                 CHECK (output IS NULL OR NOT output ? 'poison')",
            )
            .await
            .unwrap();
    }
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let mut bad = Vec::new();
    for handler in ["nul-output", "nul-error", "refused"] {
        let job = NewJob::new("q", handler, json!({})).max_attempts(1);
        bad.push((handler, client.enqueue(job).await.unwrap()));
    }
    let good = (0..300)
        .map(|_| NewJob::new("q", "noop", json!({})))
        .collect();
    client.enqueue_many(good).await.unwrap();

    let report = tokio::time::timeout(
        Duration::from_secs(60),
        Worker::new(config, set, registry())
            .stop_when_empty(true)
            .run(CancellationToken::new()),
    )
    .await
    .expect("the worker drained the queue: no write was wedged");
    assert_eq!(report.stats.succeeded, 300);

    for (handler, id) in bad {
        let outcome = client.result(id, Duration::from_secs(5)).await.unwrap();
        let JobOutcome::Dead(error) = outcome else {
            panic!("{handler}: {outcome:?}");
        };
        let expected = match handler {
            "nul-output" => "contains a NUL character",
            "nul-error" => "bad \u{FFFD} byte",
            _ => "the database refused this job's outcome",
        };
        assert!(error.contains(expected), "{handler}: {error}");
    }
}
