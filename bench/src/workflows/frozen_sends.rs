//! Sends while one destination is frozen: workflows parked in `ctx.recv`
//! on shards 1 and 2; sender workflows on shard 0, enqueued one at a time
//! at `rate` per second, each `ctx.send` one message to its recipient,
//! alternately on shard 1 and shard 2. After [`BASELINE`], shard 2's
//! server is frozen (every process stopped: connections stay open, nothing
//! answers) for `freeze`, then thawed; the senders go on [`AFTER`] more.
//! Per second, the messages that arrived on each destination (the
//! recipient's `recv` returned), timed in this process, where the worker
//! runs. Shard 1's deliveries during the freeze over its deliveries before
//! is what the freeze costs the healthy destination (goal: ≥ 90 %).
//!
//! Worker settings are a user's defaults (16 slots, 10 s statement
//! deadline): a sender to the frozen shard that waited out the deadline in
//! its slot would take the slots from the others.

use super::messages::{self, Arrivals, HANDLER, LIMIT, WORKER_SETTLES};
use super::report::FrozenSendsRun;
use super::sends::{keys_on, SENDER_HANDLER};
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
pub async fn run(shards: &BenchShards, rate: u32, freeze: Duration) -> Result<FrozenSendsRun> {
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
    let jobs = keys
        .into_iter()
        .enumerate()
        .map(|(i, key)| NewJob::new(QUEUE, HANDLER, json!({ "i": i })).ordering_key(key))
        .collect();
    let ids = shards.fill(jobs).await?;
    let arrivals: Arrivals = Arc::new((0..messages).map(|_| OnceLock::new()).collect());
    messages::park_all(shards, &arrivals).await?;

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
        for (i, (&to, key)) in ids.iter().zip(senders).enumerate() {
            tick.tick().await;
            let payload = json!({ "i": i, "to": to.to_string() });
            client
                .enqueue(NewJob::new(QUEUE, SENDER_HANDLER, payload).ordering_key(key))
                .await?;
        }
        anyhow::Ok(())
    };
    let (frozen_result, enqueued) = tokio::join!(thaw, enqueue);
    frozen_result.context("freezing shard 2")?;
    enqueued?;
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
    let mut last_frozen_arrival = start;
    for (i, arrived) in arrivals.iter().enumerate() {
        let Some(at) = arrived.get() else {
            bail!("message {i} never arrived");
        };
        if let Some(bucket) = per_second.get_mut(second(at)) {
            bucket[i % 2] += 1;
        }
        if i % 2 == 1 {
            last_frozen_arrival = last_frozen_arrival.max(*at);
        }
    }
    let rate_in = |from: Duration, to: Duration, dest: usize| {
        let (a, b) = (from.as_secs() as usize, to.as_secs() as usize);
        let n: u32 = per_second[a..b].iter().map(|s| s[dest]).sum();
        f64::from(n) / (b - a) as f64
    };
    // The first seconds of each phase are left out: the worker's start,
    // and the freeze's own first statements.
    let skip = Duration::from_secs(3);
    let healthy_before = rate_in(skip, BASELINE, 0);
    let healthy_frozen = rate_in(BASELINE + skip, BASELINE + freeze, 0);
    let thawed_at = frozen_at + freeze;
    per_second.truncate(second(&last_frozen_arrival.max(thawed_at)) + 1);
    Ok(FrozenSendsRun {
        rate,
        baseline_s: BASELINE.as_secs(),
        freeze_s: freeze.as_secs(),
        healthy_before_per_s: healthy_before,
        healthy_frozen_per_s: healthy_frozen,
        healthy_ratio: healthy_frozen / healthy_before.max(f64::MIN_POSITIVE),
        frozen_caught_up_s: last_frozen_arrival
            .saturating_duration_since(thawed_at)
            .as_secs_f64(),
        per_second: per_second.into_iter().map(|[h, f]| (h, f)).collect(),
    })
}
