//! Embedding shardq in a service: enqueue jobs and run a worker with your own
//! handler, inside your own tokio runtime.
//!
//! Against the local shards: `shardq local up && cargo run --example embed`;
//! against others: `cargo run --example embed -- path/to/shards.toml`.

use serde::{Deserialize, Serialize};
use shardq::{Config, HandlerRegistry, JobArgs, NewJob, Shardq};
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

/// A job's arguments: enqueued as a value, handed to the handler decoded.
#[derive(Serialize, Deserialize)]
struct SendEmail {
    to: String,
}

impl JobArgs for SendEmail {
    /// The handler name stored in the job's row.
    const KIND: &'static str = "send_email";
}

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
            let email = SendEmail {
                to: format!("user{i}@example.com"),
            };
            Ok(NewJob::from_args("emails", &email)?.ordering_key(format!("user{i}")))
        })
        .collect::<Result<_, shardq::ArgsError>>()?;
    let ids = shardq.client().enqueue_many(jobs).await?;
    println!("enqueued {} jobs, first {}", ids.len(), ids[0]);

    let mut handlers = HandlerRegistry::new();
    handlers.register_typed(|email: SendEmail, _ctx| async move {
        Ok(serde_json::json!({ "sent_to": email.to }))
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
