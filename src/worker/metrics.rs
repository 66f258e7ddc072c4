//! Per-shard counters and latency histograms of one worker, for operators and
//! for the benchmark. Histograms are hdrhistogram with 3 significant figures
//! and a fixed range, so memory stays bounded however long the worker runs.

use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

/// Highest latency a histogram records (longer values are clamped): one hour in µs.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// Counters of one shard, as seen by this worker.
#[derive(Debug, Default)]
pub struct ShardCounters {
    /// Claim statements that returned jobs.
    pub(crate) claims: AtomicU64,
    /// Jobs claimed.
    pub(crate) claimed: AtomicU64,
    /// Claims that found every dequeue slot taken (lock misses).
    pub(crate) busy: AtomicU64,
    /// Claims that found no ready job.
    pub(crate) empty: AtomicU64,
    /// Claims that failed.
    pub(crate) errors: AtomicU64,
    /// Outcomes written.
    pub(crate) completed: AtomicU64,
}

/// A copy of [`ShardCounters`].
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct ShardCountersSnapshot {
    /// Claim statements that returned jobs.
    pub claims: u64,
    /// Jobs claimed.
    pub claimed: u64,
    /// Lock misses.
    pub busy: u64,
    /// Empty claims.
    pub empty: u64,
    /// Failed claims.
    pub errors: u64,
    /// Outcomes written.
    pub completed: u64,
}

impl ShardCounters {
    /// Reads every counter.
    pub fn snapshot(&self) -> ShardCountersSnapshot {
        ShardCountersSnapshot {
            claims: self.claims.load(Relaxed),
            claimed: self.claimed.load(Relaxed),
            busy: self.busy.load(Relaxed),
            empty: self.empty.load(Relaxed),
            errors: self.errors.load(Relaxed),
            completed: self.completed.load(Relaxed),
        }
    }
}

/// Latency histograms, in microseconds.
#[derive(Debug, Clone)]
pub struct Latencies {
    /// Enqueue (row `created_at`) → handler start.
    pub pickup_us: Histogram<u64>,
    /// Duration of one claim statement, per shard.
    pub claim_statement_us: Vec<Histogram<u64>>,
    /// Handler end → its outcome committed.
    pub completion_lag_us: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

impl Latencies {
    fn new(shards: usize) -> Self {
        Latencies {
            pickup_us: histogram(),
            claim_statement_us: (0..shards).map(|_| histogram()).collect(),
            completion_lag_us: histogram(),
        }
    }
}

/// Per-shard counters and latencies.
#[derive(Debug)]
pub struct Metrics {
    /// Counters by shard index.
    pub(crate) shards: Vec<ShardCounters>,
    latencies: Mutex<Latencies>,
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, MAX_LATENCY_US)
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(0)
    }
}

impl Metrics {
    /// Empty metrics for `shards` shards.
    pub(crate) fn new(shards: usize) -> Self {
        Metrics {
            shards: (0..shards).map(|_| ShardCounters::default()).collect(),
            latencies: Mutex::new(Latencies::new(shards)),
        }
    }

    /// A copy of the histograms.
    pub fn latencies(&self) -> Latencies {
        self.latencies.lock().expect("latency lock").clone()
    }

    /// Per-shard counters now.
    pub fn shard_snapshots(&self) -> Vec<ShardCountersSnapshot> {
        self.shards.iter().map(ShardCounters::snapshot).collect()
    }

    pub(crate) fn record_claim_statement(&self, shard: usize, took: Duration) {
        let mut l = self.latencies.lock().expect("latency lock");
        if let Some(h) = l.claim_statement_us.get_mut(shard) {
            h.saturating_record(micros(took));
        }
    }

    pub(crate) fn record_pickup(&self, waited: Duration) {
        self.latencies
            .lock()
            .expect("latency lock")
            .pickup_us
            .saturating_record(micros(waited));
    }

    pub(crate) fn record_completion_lags(&self, lags: impl Iterator<Item = Duration>) {
        let mut l = self.latencies.lock().expect("latency lock");
        for lag in lags {
            l.completion_lag_us.saturating_record(micros(lag));
        }
    }
}
