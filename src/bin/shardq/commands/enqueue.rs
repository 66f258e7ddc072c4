//! `shardq enqueue`.

use crate::args::EnqueueArgs;
use anyhow::{Context, Result};
use shardq::config::Config;
use shardq::{Client, NewJob};
use std::time::Instant;

/// Jobs handed to one `enqueue_many` call.
const CHUNK: usize = 20_000;

pub async fn run(config: &Config, args: EnqueueArgs) -> Result<()> {
    let payload: serde_json::Value = serde_json::from_str(&args.payload)
        .with_context(|| format!("--payload is not valid JSON: {}", args.payload))?;
    let client = Client::new(config)?;
    let started = Instant::now();
    let count = enqueue_copies(
        &client,
        &args.queue,
        &args.handler,
        payload,
        args.key,
        args.priority,
        args.count,
    )
    .await?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "enqueued {count} jobs on queue `{}` in {secs:.2} s ({:.0} jobs/s)",
        args.queue,
        count as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// Enqueues `count` copies of one job in chunks; returns how many.
pub async fn enqueue_copies(
    client: &Client,
    queue: &str,
    handler: &str,
    payload: serde_json::Value,
    key: Option<String>,
    priority: i32,
    count: usize,
) -> Result<usize> {
    let mut done = 0;
    while done < count {
        let n = CHUNK.min(count - done);
        let jobs = (0..n)
            .map(|_| {
                let mut job = NewJob::new(queue, handler, payload.clone()).priority(priority);
                job.ordering_key = key.clone();
                job
            })
            .collect();
        client.enqueue_many(jobs).await?;
        done += n;
    }
    Ok(done)
}
