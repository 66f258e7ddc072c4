//! `shardq enqueue`.

use crate::args::EnqueueArgs;
use anyhow::{Context, Result};
use shardq::config::Config;
use shardq::{Client, JobId, NewJob};
use std::time::Instant;

/// Jobs handed to one `enqueue_many` call.
const CHUNK: usize = 20_000;

pub async fn run(config: &Config, args: EnqueueArgs) -> Result<()> {
    let payload: serde_json::Value = serde_json::from_str(&args.payload)
        .with_context(|| format!("--payload is not valid JSON: {}", args.payload))?;
    let client = Client::new(config)?;
    let started = Instant::now();
    let template = NewJob {
        ordering_key: args.key.clone(),
        group: args.group.clone(),
        priority: args.priority,
        delay: std::time::Duration::from_millis(args.delay_ms),
        max_attempts: args.max_attempts,
        ..NewJob::new(&args.queue, &args.handler, payload)
    };
    let ids = enqueue_copies(&client, &template, args.count).await?;
    let count = ids.len();
    if args.print_ids {
        for id in &ids {
            println!("{id}");
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "enqueued {count} jobs on queue `{}` in {secs:.2} s ({:.0} jobs/s)",
        args.queue,
        count as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// Enqueues `count` copies of `template` in chunks; returns their ids.
pub async fn enqueue_copies(
    client: &Client,
    template: &NewJob,
    count: usize,
) -> Result<Vec<JobId>> {
    let mut ids = Vec::with_capacity(count);
    while ids.len() < count {
        let n = CHUNK.min(count - ids.len());
        ids.extend(client.enqueue_many(vec![template.clone(); n]).await?);
    }
    Ok(ids)
}
