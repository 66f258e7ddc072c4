//! Send → recv latency: `messages` workflows park in `ctx.recv` on one
//! shard; then the client sends each one message, one send at a time at
//! `rate` per second. A message's latency runs from the start of its
//! `client.send` call to the moment its workflow's `recv` returned it,
//! both read from this process's monotonic clock (the worker runs here).
//! The workflows park under one worker, and the messages go to a second
//! one, started after the first has gone, so that the costs per message
//! leave the parking out.

use super::meter::Meter;
use super::report::{MessagesRun, Percentiles};
use super::servers::{BenchShards, QUEUE};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use shardq::{HandlerRegistry, NewJob};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub(super) const HANDLER: &str = "await-message";
pub(super) const TOPIC: &str = "ping";

/// Long enough that no recv times out during the run.
const RECV_TIMEOUT: Duration = Duration::from_secs(3600);

/// How long the workflows may take to park, and the last messages to arrive.
pub(super) const LIMIT: Duration = Duration::from_secs(120);

/// How long the second worker gets to connect and settle before the
/// sends start (and its start's counts with them).
pub(super) const WORKER_SETTLES: Duration = Duration::from_secs(2);

/// When each workflow's recv returned its message, by its index.
pub(super) type Arrivals = Arc<Vec<OnceLock<Instant>>>;

/// The handler: receive one message, note when.
pub(super) fn handlers(arrivals: &Arrivals) -> HandlerRegistry {
    let mut handlers = HandlerRegistry::new();
    let arrived = arrivals.clone();
    handlers.register(HANDLER, move |ctx| {
        let arrived = arrived.clone();
        async move {
            let got = ctx.recv(TOPIC, RECV_TIMEOUT).await?;
            let at = Instant::now();
            let i = ctx.payload["i"]
                .as_u64()
                .ok_or("the payload has no index")? as usize;
            if got.is_some() {
                // A replay after the success would find it set: the first time counts.
                let _ = arrived[i].set(at);
            }
            Ok(Value::Null)
        }
    });
    handlers
}

/// Parks every workflow of `shards` (filled with `arrivals.len()` of
/// [`HANDLER`]) in its recv, under a worker that then goes: its sessions
/// exit and send their counts, so none of the parking is counted after.
pub(super) async fn park_all(shards: &BenchShards, arrivals: &Arrivals) -> Result<()> {
    let parking = shards.shardq()?;
    let stop = CancellationToken::new();
    let worker = tokio::spawn(parking.worker(handlers(arrivals)).run(stop.clone()));
    let messages = arrivals.len();
    shards
        .wait_until("every workflow to park in its recv", LIMIT, |c| {
            c.parked as usize >= messages
        })
        .await?;
    stop.cancel();
    worker.await.context("the worker panicked")?;
    Ok(())
}

/// The run, on `shards` (one shard), which it empties first.
pub async fn run(shards: &BenchShards, messages: usize, rate: u32) -> Result<MessagesRun> {
    shards.reset().await?;
    let jobs = (0..messages)
        .map(|i| NewJob::new(QUEUE, HANDLER, json!({ "i": i })))
        .collect();
    let ids = shards.fill(jobs).await?;
    let arrivals: Arrivals = Arc::new((0..messages).map(|_| OnceLock::new()).collect());
    park_all(shards, &arrivals).await?;

    let shardq = shards.shardq()?;
    let client = shardq.client();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers(&arrivals)).run(stop.clone()));
    tokio::time::sleep(WORKER_SETTLES).await;
    let meter = Meter::start(shards).await?;
    let mut sent = Vec::with_capacity(messages);
    let mut send_ms = Vec::with_capacity(messages);
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    for (i, &id) in ids.iter().enumerate() {
        tick.tick().await;
        let start = Instant::now();
        client.send(id, TOPIC, json!({ "i": i }), None).await?;
        send_ms.push(start.elapsed().as_secs_f64() * 1000.0);
        sent.push(start);
    }
    shards
        .wait_until("every workflow to succeed", LIMIT, |c| {
            c.succeeded as usize >= messages
        })
        .await?;
    let cpu = meter.cpu(shards)?;
    stop.cancel();
    worker.await.context("the worker panicked")?;
    drop((client, shardq));

    let mut latency_ms = Vec::with_capacity(messages);
    for (i, start) in sent.iter().enumerate() {
        let Some(at) = arrivals[i].get() else {
            bail!(
                "workflow {} succeeded without its recv returning the message",
                ids[i]
            );
        };
        latency_ms.push(at.duration_since(*start).as_secs_f64() * 1000.0);
    }
    Ok(MessagesRun {
        messages,
        rate,
        latency_ms: Percentiles::of(latency_ms),
        send_ms: Percentiles::of(send_ms),
        per_message: cpu.per(shards, messages).await?,
    })
}
