//! Throughput of no-op workflows: `workflows` of them, each running
//! `steps` durable steps whose closures do nothing, enqueued first, then
//! drained by one worker in this process.

use super::meter::Meter;
use super::report::ThroughputRun;
use super::servers::{BenchShards, QUEUE};
use anyhow::{Context, Result};
use serde_json::Value;
use shardq::{HandlerError, HandlerRegistry, NewJob};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const HANDLER: &str = "noop-steps";

/// How long a drain may take at most, per workflow.
const LIMIT_PER_WORKFLOW: Duration = Duration::from_millis(20);

/// One run on `shards`, which it empties first.
pub async fn run(shards: &BenchShards, workflows: usize, steps: usize) -> Result<ThroughputRun> {
    shards.reset().await?;
    let jobs = (0..workflows)
        .map(|_| NewJob::new(QUEUE, HANDLER, serde_json::json!({})))
        .collect();
    shards.fill(jobs).await?;

    let mut handlers = HandlerRegistry::new();
    handlers.register(HANDLER, move |ctx| async move {
        for n in 0..steps {
            ctx.step(&format!("step-{n}"), || async {
                Ok::<(), HandlerError>(())
            })
            .await?;
        }
        Ok(Value::Null)
    });
    let meter = Meter::start(shards).await?;
    let shardq = shards.shardq()?;
    let stop = CancellationToken::new();
    let began = Instant::now();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    let limit = Duration::from_secs(30) + LIMIT_PER_WORKFLOW * workflows as u32;
    shards
        .wait_until("the workflows to succeed", limit, |c| {
            c.succeeded as usize >= workflows
        })
        .await?;
    let took = began.elapsed();
    let cpu = meter.cpu(shards)?;
    stop.cancel();
    worker.await.context("the worker panicked")?;
    drop(shardq);
    Ok(ThroughputRun {
        shards: shards.len(),
        steps,
        workflows,
        took_s: took.as_secs_f64(),
        workflows_per_s: workflows as f64 / took.as_secs_f64(),
        per_workflow: cpu.per(shards, workflows).await?,
    })
}
