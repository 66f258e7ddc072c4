//! What the processes measured, merged: latency histograms across processes
//! (hdrhistogram, 3 significant figures) and per-shard counters.

use super::proto::{self, FinalReport};
use hdrhistogram::Histogram;
use serde::Serialize;
use shardq::worker::metrics::ShardCountersSnapshot;

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
    /// Values recorded.
    pub count: u64,
}

impl Percentiles {
    /// From a histogram in microseconds.
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        let ms = |us: u64| us as f64 / 1e3;
        Percentiles {
            p50: ms(h.value_at_quantile(0.50)),
            p95: ms(h.value_at_quantile(0.95)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            count: h.len(),
        }
    }
}

/// The merged measurements of a run.
#[derive(Debug, Clone, Default)]
pub struct Merged {
    /// Enqueue → handler start.
    pub pickup: Percentiles,
    /// Claim statement duration, by shard.
    pub claim_statement: Vec<Percentiles>,
    /// Handler end → outcome committed.
    pub completion_lag: Percentiles,
    /// Counters by shard, summed over processes.
    pub counters: Vec<ShardCountersSnapshot>,
    /// Completions rejected by the fence, summed.
    pub fenced: u64,
}

/// Merges the final reports of all processes of a run on `shards` shards.
pub fn merge(finals: &[FinalReport], shards: usize) -> Merged {
    let mut pickup = proto::histogram();
    let mut lag = proto::histogram();
    let mut statement: Vec<_> = (0..shards).map(|_| proto::histogram()).collect();
    let mut counters = vec![ShardCountersSnapshot::default(); shards];
    let mut fenced = 0;
    for f in finals {
        proto::add_pairs(&mut pickup, &f.pickup_us);
        proto::add_pairs(&mut lag, &f.completion_lag_us);
        for (h, pairs) in statement.iter_mut().zip(&f.claim_statement_us) {
            proto::add_pairs(h, pairs);
        }
        for (sum, c) in counters.iter_mut().zip(&f.shards) {
            sum.claims += c.claims;
            sum.claimed += c.claimed;
            sum.busy += c.busy;
            sum.empty += c.empty;
            sum.errors += c.errors;
            sum.completed += c.completed;
        }
        fenced += f.fenced;
    }
    Merged {
        pickup: Percentiles::of(&pickup),
        claim_statement: statement.iter().map(Percentiles::of).collect(),
        completion_lag: Percentiles::of(&lag),
        counters,
        fenced,
    }
}

/// Fraction of claim attempts that found every dequeue slot taken.
pub fn lock_miss_rate(counters: &[ShardCountersSnapshot]) -> f64 {
    share_of_attempts(counters, |c| c.busy)
}

/// Fraction of claim attempts that found a slot but no ready job.
pub fn empty_rate(counters: &[ShardCountersSnapshot]) -> f64 {
    share_of_attempts(counters, |c| c.empty)
}

/// `part` over every claim attempt (claims, busy, empty, failed), all shards.
fn share_of_attempts(
    counters: &[ShardCountersSnapshot],
    part: fn(&ShardCountersSnapshot) -> u64,
) -> f64 {
    let part: u64 = counters.iter().map(part).sum();
    let attempts: u64 = counters
        .iter()
        .map(|c| c.claims + c.busy + c.empty + c.errors)
        .sum();
    if attempts == 0 {
        0.0
    } else {
        part as f64 / attempts as f64
    }
}
