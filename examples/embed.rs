//! Embedding shardq in a service: enqueue jobs and run a worker with your own
//! handler, inside your own tokio runtime.
//!
//! Against the local shards: `shardq local up && cargo run --example embed`;
//! against others: `cargo run --example embed -- path/to/shards.toml`.

use shardq::{Config, HandlerRegistry, NewJob, Shardq};
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The file given (or shards.toml, or the local shards) plus SHARDQ_* variables.
    let path = std::env::args().nth(1).map(PathBuf::from);
    let mut config = Config::load(path.as_deref())?;
    config.worker.queues = vec!["emails".into()];
    let shardq = Shardq::connect(config)?;
    shardq.migrate().await?;

    // Jobs with the same ordering key land on one shard and run in order.
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
    let ids = shardq.client().enqueue_many(jobs).await?;
    println!("enqueued {} jobs, first {}", ids.len(), ids[0]);

    let mut handlers = HandlerRegistry::new();
    handlers.register("send_email", |ctx| async move {
        let to = ctx.payload["to"].as_str().unwrap_or("?").to_string();
        Ok(serde_json::json!({ "sent_to": to }))
    });

    // Stops by itself when the queue is empty; in a service, cancel the token on shutdown.
    let report = shardq
        .worker(handlers)
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    println!("done: {} succeeded", report.stats.succeeded);
    Ok(())
}
