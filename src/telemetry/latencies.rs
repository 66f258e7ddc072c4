//! Latency histograms (hdrhistogram, 3 significant figures, a fixed range,
//! so memory stays bounded however long the worker runs), for operators and
//! the benchmark.

use hdrhistogram::Histogram;
use std::time::Duration;

/// Highest latency a histogram records (longer values are clamped): one hour in µs.
const MAX_LATENCY_US: u64 = 3_600_000_000;

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

/// `d` in µs, within the histograms' range.
pub(super) fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, MAX_LATENCY_US)
}

impl Latencies {
    pub(super) fn new(shards: usize) -> Self {
        Latencies {
            pickup_us: histogram(),
            claim_statement_us: (0..shards).map(|_| histogram()).collect(),
            completion_lag_us: histogram(),
        }
    }
}
