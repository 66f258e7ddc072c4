//! Per-shard counters and latency histograms of one worker, for operators and
//! for the benchmark. Histograms are hdrhistogram with 3 significant figures
//! and a fixed range, so memory stays bounded however long the worker runs.
//!
//! The Prometheus exposition ([`crate::prometheus::WorkerMetrics`]) reads
//! these same counters; what it adds on the per-job path (outcomes by shard,
//! bucketed latencies, the buffer and running gauges) is relaxed atomics
//! only: no lock, no allocation.

use crate::prometheus::histogram::LatencyHistogram;
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
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
    /// Claims not answered within the shard's budget (see `shard_health`).
    pub(crate) detached: AtomicU64,
    /// Outcomes written.
    pub(crate) completed: AtomicU64,
    /// Outcomes written by kind, and the rest of what the worker learns
    /// about this shard's jobs (for the exposition).
    pub(crate) outcomes: OutcomeCounters,
    /// Handler end → outcome written.
    pub(crate) completion_lag: LatencyHistogram,
}

/// What became of the jobs of one shard, as this worker learned it.
#[derive(Debug, Default)]
pub(crate) struct OutcomeCounters {
    pub succeeded: AtomicU64,
    pub retrying: AtomicU64,
    pub dead: AtomicU64,
    pub cancelled: AtomicU64,
    /// Unstarted jobs given back (shutdown, a lost claim reply, a held-back key run).
    pub released: AtomicU64,
    /// Completions refused by the fence (lease lost, job re-claimed).
    pub fenced: AtomicU64,
    /// Expired leases (of any worker) this process's maintenance recovered.
    pub recovered: AtomicU64,
    /// Handlers abandoned after `worker.handler_timeout` (their attempts
    /// also count as retrying or dead).
    pub abandoned: AtomicU64,
    /// Completion statements.
    pub statements: AtomicU64,
}

/// Claims of one (shard, queue) pair and the latencies of its jobs.
#[derive(Debug, Default)]
pub(crate) struct TargetCounters {
    pub claims: AtomicU64,
    pub claimed: AtomicU64,
    pub busy: AtomicU64,
    pub empty: AtomicU64,
    pub errors: AtomicU64,
    /// K: the dequeue slots this process's claims try there now (0 ungated).
    pub slots: AtomicU64,
    /// One claim statement, busy and empty answers included.
    pub claim_duration: LatencyHistogram,
    /// Enqueue (`created_at`, the shard's clock) → handler start.
    pub pickup: LatencyHistogram,
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
    /// The queues served, in `worker.queues` order.
    pub(crate) queues: Vec<String>,
    /// Counters by target: shard index × queues + queue index.
    pub(crate) targets: Vec<TargetCounters>,
    /// Jobs claimed and not yet started (or given back unstarted).
    pub(crate) buffered: AtomicI64,
    /// Handlers running now.
    pub(crate) running: AtomicI64,
    latencies: Mutex<Latencies>,
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, MAX_LATENCY_US)
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(0, Vec::new())
    }
}

impl Metrics {
    /// Empty metrics for `shards` shards and these queues.
    pub(crate) fn new(shards: usize, queues: Vec<String>) -> Self {
        Metrics {
            shards: (0..shards).map(|_| ShardCounters::default()).collect(),
            targets: (0..shards * queues.len())
                .map(|_| TargetCounters::default())
                .collect(),
            queues,
            buffered: AtomicI64::new(0),
            running: AtomicI64::new(0),
            latencies: Mutex::new(Latencies::new(shards)),
        }
    }

    /// The counters of `queue` on shard `shard`, when this worker serves it.
    /// A linear search: a worker serves a handful of queues.
    pub(crate) fn target(&self, shard: usize, queue: &str) -> Option<&TargetCounters> {
        let q = self.queues.iter().position(|name| name == queue)?;
        self.targets.get(shard * self.queues.len() + q)
    }

    /// Counts one claim of target `target` (as numbered by the worker's
    /// targets: shard-major, queues in order).
    pub(crate) fn record_target_claim(
        &self,
        target: usize,
        result: &Result<crate::store::jobs::Claim, crate::shards::ShardError>,
        took: Duration,
    ) {
        use crate::store::jobs::Claim;
        let Some(t) = self.targets.get(target) else {
            return;
        };
        let counter = match result {
            Ok(Claim::Jobs(jobs)) => {
                t.claimed.fetch_add(jobs.len() as u64, Relaxed);
                self.buffered.fetch_add(jobs.len() as i64, Relaxed);
                &t.claims
            }
            Ok(Claim::Busy) => &t.busy,
            Ok(Claim::Empty) => &t.empty,
            Err(_) => &t.errors,
        };
        counter.fetch_add(1, Relaxed);
        t.claim_duration.record(took);
    }

    /// Counts how a batch of completions of shard `shard` landed.
    pub(crate) fn record_outcomes(&self, shard: usize, w: &crate::store::jobs::Written) {
        let Some(o) = self.shards.get(shard).map(|s| &s.outcomes) else {
            return;
        };
        for (counter, n) in [
            (&o.succeeded, w.succeeded),
            (&o.retrying, w.retrying),
            (&o.dead, w.dead),
            (&o.cancelled, w.cancelled),
            (&o.released, w.released),
            (&o.fenced, w.fenced),
            (&o.statements, 1),
        ] {
            counter.fetch_add(n, Relaxed);
        }
    }

    /// Counts `n` expired leases recovered on shard `shard`.
    pub(crate) fn record_recovered(&self, shard: usize, n: u64) {
        if let Some(s) = self.shards.get(shard) {
            s.outcomes.recovered.fetch_add(n, Relaxed);
        }
    }

    /// Counts a handler abandoned on shard `shard`.
    pub(crate) fn record_abandoned(&self, shard: usize) {
        if let Some(s) = self.shards.get(shard) {
            s.outcomes.abandoned.fetch_add(1, Relaxed);
        }
    }

    /// `n` buffered jobs left the buffer (started, or given back unstarted).
    pub(crate) fn unbuffered(&self, n: usize) {
        self.buffered.fetch_sub(n as i64, Relaxed);
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

    pub(crate) fn record_pickup(&self, shard: usize, queue: &str, waited: Duration) {
        if let Some(t) = self.target(shard, queue) {
            t.pickup.record(waited);
        }
        self.latencies
            .lock()
            .expect("latency lock")
            .pickup_us
            .saturating_record(micros(waited));
    }

    pub(crate) fn record_completion_lags(
        &self,
        shard: usize,
        lags: impl Iterator<Item = Duration>,
    ) {
        let per_shard = self.shards.get(shard).map(|s| &s.completion_lag);
        let mut l = self.latencies.lock().expect("latency lock");
        for lag in lags {
            if let Some(h) = per_shard {
                h.record(lag);
            }
            l.completion_lag_us.saturating_record(micros(lag));
        }
    }
}
