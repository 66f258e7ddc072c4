//! The steady offer: no-op jobs at a fixed rate over every shard (random
//! shard keys), counted per shard, with one job in [`SAMPLE_EVERY`] kept
//! for the pickup times.

use anyhow::Result;
use serde_json::json;
use shardq::job::JobId;
use shardq::{Client, NewJob};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// One job in this many is sampled for its pickup time.
pub const SAMPLE_EVERY: usize = 50;

/// How often the offer catches up with its rate.
const TICK: Duration = Duration::from_millis(50);

/// Most jobs in one enqueue call (an offer that fell behind catches up in
/// calls of this size).
const MAX_CALL: u64 = 5_000;

/// What was offered so far, per shard, and the sampled jobs not yet read.
pub struct Offered {
    per_shard: Vec<AtomicU64>,
    sampled: Mutex<Vec<JobId>>,
}

impl Offered {
    pub fn new(shards: usize) -> Arc<Offered> {
        Arc::new(Offered {
            per_shard: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            sampled: Mutex::new(Vec::new()),
        })
    }

    /// Jobs offered to each shard so far.
    pub fn per_shard(&self) -> Vec<u64> {
        self.per_shard
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    /// The sampled jobs since the last call.
    pub fn take_sampled(&self) -> Vec<JobId> {
        std::mem::take(&mut *self.sampled.lock().unwrap())
    }
}

/// Offers `rate` jobs per second until `stop`, spread over `keys` ordering
/// keys or `groups` groups in turn (neither when 0); returns how many it
/// enqueued.
pub async fn run(
    client: Client,
    rate: u64,
    keys: u64,
    groups: u64,
    offered: Arc<Offered>,
    stop: CancellationToken,
) -> Result<u64> {
    let started = Instant::now();
    let mut sent: u64 = 0;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(sent),
            _ = tick.tick() => {}
        }
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        let n = due.saturating_sub(sent).min(MAX_CALL);
        if n == 0 {
            continue;
        }
        let jobs = (sent..sent + n)
            .map(|i| {
                let job = NewJob::new("bench", "noop", json!({}));
                match (keys, groups) {
                    (0, 0) => job,
                    (0, g) => job.group(format!("tenant-{}", i % g)),
                    (k, _) => job.ordering_key(format!("k{}", i % k)),
                }
            })
            .collect();
        let ids = client.enqueue_many(jobs).await?;
        let map = client.shards().routing().get();
        for id in &ids {
            offered.per_shard[map.shard_for(id.shard_key)].fetch_add(1, Ordering::Relaxed);
        }
        offered
            .sampled
            .lock()
            .unwrap()
            .extend(ids.iter().step_by(SAMPLE_EVERY).copied());
        sent += n;
    }
}
