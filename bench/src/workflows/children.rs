//! A parent gathering children: it starts `children` children
//! (`ctx.start_child`, no-op workflows), then awaits each one's `result()`,
//! parking while one is unfinished. Parents run one after the other, each
//! timed from its enqueue to its success.

use super::meter::Meter;
use super::report::{median, ChildrenRun, Gather};
use super::servers::{BenchShards, OBSERVER, QUEUE};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use shardq::{ChildResult, HandlerRegistry, NewJob};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const PARENT: &str = "gather";
const CHILD: &str = "gathered";

/// How long one gather may take.
const LIMIT: Duration = Duration::from_secs(120);

/// How often the bench looks whether the parent succeeded.
const POLL: Duration = Duration::from_millis(20);

/// What a children run does.
#[derive(Debug, Clone, Copy)]
pub struct Gathering {
    /// Children per parent.
    pub children: usize,
    /// How long each child works before it succeeds.
    pub child_work: Duration,
    /// Parents, one after the other.
    pub gathers: usize,
    /// Each child keyed by a key of its own (spread over the shards).
    pub keyed: bool,
}

/// The run, on `shards`, which it empties first.
pub async fn run(shards: &BenchShards, g: Gathering) -> Result<ChildrenRun> {
    let Gathering {
        children,
        child_work,
        gathers,
        keyed,
    } = g;
    shards.reset().await?;
    let runs = Arc::new(AtomicU64::new(0));
    let mut handlers = HandlerRegistry::new();
    handlers.register(CHILD, move |_ctx| async move {
        if !child_work.is_zero() {
            tokio::time::sleep(child_work).await;
        }
        Ok(Value::Null)
    });
    let counted = runs.clone();
    handlers.register(PARENT, move |ctx| {
        counted.fetch_add(1, Ordering::Relaxed);
        async move {
            let mut started = Vec::with_capacity(children);
            for n in 0..children {
                let child = NewJob::new(QUEUE, CHILD, json!({}));
                let child = match keyed {
                    true => child.ordering_key(format!("{}-{n}", ctx.id)),
                    false => child,
                };
                started.push(ctx.start_child(child).await?);
            }
            for child in &started {
                match child.result().await? {
                    ChildResult::Succeeded(_) => {}
                    other => return Err(format!("child {} ended {other:?}", child.id()).into()),
                }
            }
            Ok(Value::Null)
        }
    });
    let shardq = shards.shardq()?;
    let client = shardq.client();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));

    let meter = Meter::start(shards).await?;
    let mut done = Vec::with_capacity(gathers);
    for _ in 0..gathers {
        runs.store(0, Ordering::Relaxed);
        let began = Instant::now();
        let id = client
            .enqueue(NewJob::new(QUEUE, PARENT, json!({})))
            .await?;
        let shard_ms = loop {
            if let Some(ms) = succeeded_after(shards, id).await? {
                break ms;
            }
            if began.elapsed() > LIMIT {
                bail!("parent {id} did not succeed within {LIMIT:?}");
            }
            tokio::time::sleep(POLL).await;
        };
        done.push(Gather {
            shard_ms,
            wall_ms: began.elapsed().as_secs_f64() * 1000.0,
            parent_runs: runs.load(Ordering::Relaxed),
        });
    }
    let cpu = meter.cpu(shards)?;
    stop.cancel();
    worker.await.context("the worker panicked")?;
    drop((client, shardq));
    Ok(ChildrenRun {
        shards: shards.len(),
        keyed,
        children,
        child_work_ms: child_work.as_millis() as u64,
        median_shard_ms: median(done.iter().map(|g| g.shard_ms).collect()),
        median_wall_ms: median(done.iter().map(|g| g.wall_ms).collect()),
        gathers: done,
        per_gather: cpu.per(shards, gathers).await?,
    })
}

/// The parent's enqueue-to-success time by the shard's clock, ms, once it
/// has succeeded; fails when it ended otherwise.
async fn succeeded_after(shards: &BenchShards, id: shardq::JobId) -> Result<Option<f64>> {
    let sql = format!(
        "SELECT status, (extract(epoch FROM finished_at - created_at) * 1000)::float8 \
         FROM workflow_status WHERE shard_key = $1 AND id = $2 {OBSERVER}"
    );
    let db = shards.observer().for_key(id.shard_key).client().await?;
    let row = db.query_one(sql.as_str(), &[&id.shard_key, &id.id]).await?;
    let status: String = row.get(0);
    match status.as_str() {
        "succeeded" => Ok(Some(row.get(1))),
        "dead" | "cancelled" => bail!("parent {id} ended {status}: see the worker's log"),
        _ => Ok(None),
    }
}
