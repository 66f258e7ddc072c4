//! Sends between workflows (`ctx.send`), on one shard and between two:
//! `messages` workflows park in `ctx.recv` on shard 1; then sender
//! workflows, one per message, enqueued one at a time at `rate` per
//! second, each `ctx.send` one message to its recipient. The senders live
//! on shard 1 too (the same shard) or on shard 0 (another shard), by their
//! ordering keys. A message's latency runs from just before its sender's
//! `ctx.send` to the moment its recipient's `recv` returned it, both read
//! from this process's monotonic clock (the worker runs here).
//!
//! A send to another shard is written straight to the recipient's shard
//! (`shardq_send`, idempotent by a key derived from the sender's step),
//! then recorded as the sender's step on its own: no relay between them.

use super::messages::{self, Arrivals, HANDLER, LIMIT, TOPIC, WORKER_SETTLES};
use super::meter::Meter;
use super::report::{Percentiles, SendsRun};
use super::servers::{BenchShards, QUEUE};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use shardq::{HandlerRegistry, JobId, NewJob};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The sender workflows' handler: one `ctx.send` to the workflow its
/// payload names.
pub(super) const SENDER_HANDLER: &str = "send-one";

/// The recipients' shard.
const RECIPIENTS: usize = 1;

/// `n` distinct ordering keys that route to shard `index` of `shards`.
pub(super) fn keys_on(shards: &BenchShards, index: usize, prefix: &str, n: usize) -> Vec<String> {
    let set = shards.observer();
    (0..)
        .map(|j| format!("{prefix}-{j}"))
        .filter(|k| set.for_key(shardq::router::shard_key_for(k)).index == index)
        .take(n)
        .collect()
}

/// The recipients' handler ([`messages::handlers`], noting arrivals) and
/// the senders' ([`SENDER_HANDLER`], noting when each first tried its send).
pub(super) fn handlers(arrivals: &Arrivals, sent: &Arrivals) -> HandlerRegistry {
    let mut handlers = messages::handlers(arrivals);
    let noted = sent.clone();
    handlers.register(SENDER_HANDLER, move |ctx| {
        let noted = noted.clone();
        async move {
            let i = ctx.payload["i"].as_u64().ok_or("no index")? as usize;
            let to: JobId = ctx.payload["to"]
                .as_str()
                .ok_or("no recipient")?
                .parse()
                .map_err(|_| "a bad recipient")?;
            // A replay finds it set: the first try counts.
            let _ = noted[i].set(Instant::now());
            ctx.send(to, TOPIC, json!({ "i": i })).await?;
            Ok(Value::Null)
        }
    });
    handlers
}

/// One recipient workflow per key (recipient `i` keyed by `keys[i]`),
/// parked in its recv; their ids, and where their arrivals will be noted.
pub(super) async fn park_recipients(
    shards: &BenchShards,
    keys: Vec<String>,
) -> Result<(Vec<JobId>, Arrivals)> {
    let messages = keys.len();
    let jobs = keys
        .into_iter()
        .enumerate()
        .map(|(i, key)| NewJob::new(QUEUE, HANDLER, json!({ "i": i })).ordering_key(key))
        .collect();
    let ids = shards.fill(jobs).await?;
    let arrivals: Arrivals = Arc::new((0..messages).map(|_| OnceLock::new()).collect());
    messages::park_all(shards, &arrivals).await?;
    Ok((ids, arrivals))
}

/// The run on `shards` (two), which it empties first: senders on shard
/// `from` (0: another shard than their recipients'; 1: the same).
pub async fn run(
    shards: &BenchShards,
    messages: usize,
    rate: u32,
    from: usize,
) -> Result<SendsRun> {
    if shards.len() < 2 {
        bail!("sends between workflows need two shards");
    }
    shards.reset().await?;
    let (ids, arrivals) =
        park_recipients(shards, keys_on(shards, RECIPIENTS, "to", messages)).await?;
    let sent: Arrivals = Arc::new((0..messages).map(|_| OnceLock::new()).collect());
    let handlers = handlers(&arrivals, &sent);
    let shardq = shards.shardq()?;
    let client = shardq.client();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    tokio::time::sleep(WORKER_SETTLES).await;
    let meter = Meter::start(shards).await?;
    let senders = keys_on(shards, from, "from", messages);
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    for (i, (&to, key)) in ids.iter().zip(senders).enumerate() {
        tick.tick().await;
        let payload = json!({ "i": i, "to": to.to_string() });
        client
            .enqueue(NewJob::new(QUEUE, SENDER_HANDLER, payload).ordering_key(key))
            .await?;
    }
    shards
        .wait_until("every recipient and sender to succeed", LIMIT, |c| {
            c.succeeded as usize >= 2 * messages
        })
        .await?;
    let cpu = meter.cpu(shards)?;
    stop.cancel();
    worker.await.context("the worker panicked")?;
    drop((client, shardq));

    let mut latency_ms = Vec::with_capacity(messages);
    for i in 0..messages {
        let (Some(start), Some(at)) = (sent[i].get(), arrivals[i].get()) else {
            bail!("message {i} was not both sent and received");
        };
        latency_ms.push(at.duration_since(*start).as_secs_f64() * 1000.0);
    }
    Ok(SendsRun {
        messages,
        rate,
        between_shards: from != RECIPIENTS,
        latency_ms: Percentiles::of(latency_ms),
        per_message: cpu.per(shards, messages).await?,
    })
}
