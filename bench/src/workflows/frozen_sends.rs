//! Sends while one destination is frozen: workflows parked in `ctx.recv`
//! on shards 1 and 2; sender workflows on shard 0, enqueued one at a time
//! at `rate` per second, each `ctx.send` one message to its recipient,
//! alternately on shard 1 and shard 2. After [`BASELINE`], shard 2's
//! server is frozen (every process stopped: connections stay open, nothing
//! answers) for `freeze`, then thawed; the senders go on [`AFTER`] more.
//! Per second, the messages that arrived on each destination (the
//! recipient's `recv` returned), timed in this process, where the worker
//! runs. Shard 1's deliveries over the whole freeze over its deliveries
//! before is what the freeze costs the healthy destination (goal: ≥ 90 %);
//! its fewest in one second of the freeze shows the dip while the worker
//! finds the shard silent; and the frozen shard's backlog (messages whose
//! sender was enqueued before the thaw) is delivered some seconds after.
//!
//! Worker settings are a user's defaults (16 slots, 10 s statement
//! deadline; `--small-buffers`: a buffer of 200 jobs, claims of 50): a
//! sender to the frozen shard that waited out the deadline in its slot
//! would take the slots from the others.

use super::messages::{Arrivals, LIMIT, WORKER_SETTLES};
use super::report::FrozenSendsRun;
use super::sends::{keys_on, park_recipients, SENDER_HANDLER};
use super::servers::{BenchShards, QUEUE};
use anyhow::{bail, Context, Result};
use serde_json::json;
use shardq::NewJob;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Sends before the freeze, for the healthy destination's rate.
const BASELINE: Duration = Duration::from_secs(15);
/// Sends after the thaw.
const AFTER: Duration = Duration::from_secs(15);
/// The frozen shard.
const FROZEN: usize = 2;
/// The healthy destination.
const HEALTHY: usize = 1;

/// The run on `shards` (three), which it empties first.
pub async fn run(
    shards: &BenchShards,
    rate: u32,
    freeze: Duration,
    small_buffers: bool,
) -> Result<FrozenSendsRun> {
    if shards.len() < 3 {
        bail!("sends through a frozen shard need three shards");
    }
    shards.reset().await?;
    let length = BASELINE + freeze + AFTER;
    let messages = (length.as_secs_f64() * f64::from(rate)) as usize;
    // Recipient i lives on shard 1 for even i, on shard 2 for odd i.
    let mut healthy = keys_on(shards, HEALTHY, "ok", messages.div_ceil(2)).into_iter();
    let mut frozen = keys_on(shards, FROZEN, "cold", messages / 2).into_iter();
    let keys: Vec<String> = (0..messages)
        .map(|i| {
            let next = if i % 2 == 0 {
                healthy.next()
            } else {
                frozen.next()
            };
            next.expect("a key per recipient")
        })
        .collect();
    let (ids, arrivals) = park_recipients(shards, keys).await?;
    let sent: Arrivals = Arc::new((0..messages).map(|_| OnceLock::new()).collect());
    let shardq = shards.shardq()?;
    let client = shardq.client();
    let stop = CancellationToken::new();
    let handlers = super::sends::handlers(&arrivals, &sent);
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    tokio::time::sleep(WORKER_SETTLES).await;
    let senders = keys_on(shards, 0, "from", messages);
    let start = Instant::now();
    let frozen_at = start + BASELINE;
    let thaw = {
        let hold = freeze;
        async move {
            tokio::time::sleep_until(frozen_at.into()).await;
            shards.freeze(FROZEN, hold).await
        }
    };
    let enqueue = async {
        let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
        let mut enqueued = Vec::with_capacity(messages);
        for (i, (&to, key)) in ids.iter().zip(senders).enumerate() {
            tick.tick().await;
            let payload = json!({ "i": i, "to": to.to_string() });
            client
                .enqueue(NewJob::new(QUEUE, SENDER_HANDLER, payload).ordering_key(key))
                .await?;
            enqueued.push(Instant::now());
        }
        anyhow::Ok(enqueued)
    };
    let (frozen_result, enqueued) = tokio::join!(thaw, enqueue);
    frozen_result.context("freezing shard 2")?;
    let enqueued = enqueued?;
    shards
        .wait_until("every recipient and sender to succeed", LIMIT, |c| {
            c.succeeded as usize >= 2 * messages
        })
        .await?;
    stop.cancel();
    worker.await.context("the worker panicked")?;
    drop((client, shardq));

    let second = |at: &Instant| at.saturating_duration_since(start).as_secs() as usize;
    let seconds = length.as_secs() as usize + LIMIT.as_secs() as usize;
    let mut per_second = vec![[0u32; 2]; seconds];
    let thawed_at = frozen_at + freeze;
    // The last arrival of a message to the frozen shard whose sender was
    // enqueued before the thaw: when that shard's backlog was delivered.
    let mut backlog_delivered = thawed_at;
    for (i, arrived) in arrivals.iter().enumerate() {
        let Some(at) = arrived.get() else {
            bail!("message {i} never arrived");
        };
        if let Some(bucket) = per_second.get_mut(second(at)) {
            bucket[i % 2] += 1;
        }
        if i % 2 == 1 && enqueued[i] < thawed_at {
            backlog_delivered = backlog_delivered.max(*at);
        }
    }
    let healthy_in = |from: Duration, to: Duration| -> Vec<u32> {
        let (a, b) = (from.as_secs() as usize, to.as_secs() as usize);
        per_second[a..b].iter().map(|s| s[0]).collect()
    };
    let mean = |seconds: &[u32]| f64::from(seconds.iter().sum::<u32>()) / seconds.len() as f64;
    // The first seconds of the baseline are left out: the worker's start.
    let before = healthy_in(Duration::from_secs(3), BASELINE);
    let during = healthy_in(BASELINE, BASELINE + freeze);
    let (healthy_before, healthy_frozen) = (mean(&before), mean(&during));
    let last = second(&backlog_delivered.max(start + length));
    per_second.truncate(last + 1);
    Ok(FrozenSendsRun {
        rate,
        small_buffers,
        baseline_s: BASELINE.as_secs(),
        freeze_s: freeze.as_secs(),
        healthy_before_per_s: healthy_before,
        healthy_frozen_per_s: healthy_frozen,
        healthy_ratio: healthy_frozen / healthy_before.max(f64::MIN_POSITIVE),
        healthy_fewest_in_a_second: during.iter().copied().min().unwrap_or(0),
        backlog_delivered_s: backlog_delivered
            .saturating_duration_since(thawed_at)
            .as_secs_f64(),
        per_second: per_second.into_iter().map(|[h, f]| (h, f)).collect(),
    })
}
