//! A latency histogram with fixed buckets and atomic counts: recording is a
//! few relaxed atomic adds, no lock and no allocation, so it can sit on the
//! per-job path. (prometheus-client's own `Histogram` takes a mutex per
//! observation.) A scrape reads it with [`LatencyHistogram::read`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Bucket upper bounds in µs: 0.5 ms to 5 min, about ×2–2.5 apart, which
/// covers a claim statement (ms), a completion lag (ms) and a pickup under
/// backlog (minutes) with one set.
const BOUNDS_US: [u64; 17] = [
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    300_000_000,
];

/// Counts of durations by bucket, their sum and their number.
#[derive(Debug, Default)]
pub(crate) struct LatencyHistogram {
    /// Per bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; BOUNDS_US.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl LatencyHistogram {
    /// Counts one duration.
    pub(crate) fn record(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_US.partition_point(|&bound| bound < us);
        self.buckets[bucket].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    /// The buckets as (upper bound in seconds, count in that bucket alone),
    /// the last bound `+Inf`, and the sum of the durations in seconds.
    pub(crate) fn read(&self) -> (Vec<(f64, u64)>, f64) {
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let bound = BOUNDS_US
                    .get(i)
                    .map_or(f64::INFINITY, |&us| us as f64 / 1e6);
                (bound, n.load(Relaxed))
            })
            .collect();
        (buckets, self.sum_us.load(Relaxed) as f64 / 1e6)
    }

    /// Durations counted so far.
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_lands_in_the_first_bucket_that_holds_it() {
        let h = LatencyHistogram::default();
        h.record(Duration::from_micros(500));
        h.record(Duration::from_micros(501));
        h.record(Duration::from_secs(3600));
        assert_eq!(h.buckets[0].load(Relaxed), 1);
        assert_eq!(h.buckets[1].load(Relaxed), 1);
        assert_eq!(h.buckets[BOUNDS_US.len()].load(Relaxed), 1);
        assert_eq!(h.count(), 3);
    }
}
