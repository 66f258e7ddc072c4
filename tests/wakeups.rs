//! Wake-ups: a statement that makes jobs ready notifies `shardq_ready` with
//! the queue's name, once per transaction and queue however many jobs it
//! writes; delayed jobs notify when they become due.

mod common;

use common::TestShards;
use shardq::store::upkeep;
use shardq::{Client, NewJob};
use std::time::Duration;

/// Every payload that arrives within `wait`.
async fn drain(
    payloads: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    wait: Duration,
) -> Vec<String> {
    let mut got = Vec::new();
    while let Ok(Some(p)) = tokio::time::timeout(wait, payloads.recv()).await {
        got.push(p);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_jobs_notify_once_per_statement_and_queue() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let shard = set.get(0);
    let mut listener = shard
        .listen("shardq_ready")
        .await
        .unwrap()
        .expect("a direct connection listens");

    // 1,000 jobs of two queues in one call (one statement on the one shard).
    let jobs = (0..1_000)
        .map(|i| {
            NewJob::new(
                if i % 2 == 0 { "a" } else { "b" },
                "noop",
                serde_json::json!({}),
            )
        })
        .collect();
    client.enqueue_many(jobs).await.unwrap();
    let mut got = drain(&mut listener.payloads, Duration::from_millis(500)).await;
    got.sort();
    assert_eq!(got, vec!["a".to_string(), "b".to_string()]);

    // A delayed job says nothing until it is due and promoted.
    client
        .enqueue(
            NewJob::new("later", "noop", serde_json::json!({})).delay(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    assert!(drain(&mut listener.payloads, Duration::from_millis(300))
        .await
        .is_empty());
    assert_eq!(upkeep::promote_due(shard, 10).await.unwrap(), 1);
    assert_eq!(
        drain(&mut listener.payloads, Duration::from_millis(500)).await,
        vec!["later".to_string()]
    );
}
