//! Embedding shardq in a service: enqueue jobs and run a worker with your own
//! handler, inside your own tokio runtime.
//!
//! Run against the local shards: `shardq local up && shardq migrate && cargo run --example embed`.

use shardq::shards::ShardSet;
use shardq::{Client, Config, HandlerRegistry, NewJob, Worker};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // shards.toml (or the local shards when there is none) plus SHARDQ_* variables.
    let mut config = Config::load(None)?;
    config.worker.queues = vec!["emails".into()];
    let shards = ShardSet::connect(&config)?;
    shardq::migrate::migrate_all(&shards).await?;

    // Jobs with the same ordering key land on one shard and run in order.
    let client = Client::from_shards(shards.clone(), config.limits.clone());
    let jobs = (0..10)
        .map(|i| {
            NewJob::new(
                "emails",
                "send_email",
                serde_json::json!({ "to": format!("user{i}@example.com") }),
            )
            .ordering_key(format!("user{i}"))
        })
        .collect();
    let ids = client.enqueue_many(jobs).await?;
    println!("enqueued {} jobs, first {}", ids.len(), ids[0]);

    let mut handlers = HandlerRegistry::new();
    handlers.register("send_email", |ctx| async move {
        let to = ctx.payload["to"].as_str().unwrap_or("?").to_string();
        Ok(serde_json::json!({ "sent_to": to }))
    });

    // Stops by itself when the queue is empty; in a service, cancel the token on shutdown.
    let report = Worker::new(config, shards, handlers)
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    println!("done: {} succeeded", report.stats.succeeded);
    Ok(())
}
