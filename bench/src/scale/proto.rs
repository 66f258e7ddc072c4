//! What a `shardq-bench scale-worker` process tells the bench, one JSON object per
//! line on its stdout; and what the bench tells it on its stdin (`go`, then
//! end of input to stop).

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use shardq::worker::metrics::ShardCountersSnapshot;

/// Sent on the worker's stdin to start claiming.
pub const GO: &str = "go";

/// How often a worker prints its counters.
pub const SAMPLE_EVERY_MS: u64 = 50;

/// Highest latency the bench's merged histograms hold (µs): one hour, as the
/// workers' own.
pub const MAX_LATENCY_US: u64 = 3_600_000_000;

/// One counter reading of one process.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Wall time of the reading, ms since the Unix epoch.
    pub unix_ms: f64,
    /// Cumulative counters by shard.
    pub shards: Vec<ShardCountersSnapshot>,
}

/// One line of a worker's output.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    /// Pools are warm; waiting for [`GO`].
    Ready,
    /// Cumulative per-shard counters at wall time `unix_ms`.
    Sample {
        /// Milliseconds since the Unix epoch when the counters were read.
        unix_ms: f64,
        /// Counters by shard index.
        shards: Vec<ShardCountersSnapshot>,
    },
    /// At exit: the final counters and the latency histograms.
    Final(Box<FinalReport>),
}

/// A worker's last line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FinalReport {
    /// Counters by shard index.
    pub shards: Vec<ShardCountersSnapshot>,
    /// Enqueue → handler start, as (value µs, count).
    pub pickup_us: Vec<(u64, u64)>,
    /// Claim statement duration per shard, as (value µs, count).
    pub claim_statement_us: Vec<Vec<(u64, u64)>>,
    /// Handler end → outcome committed, as (value µs, count).
    pub completion_lag_us: Vec<(u64, u64)>,
    /// Completions rejected by the fence (should be 0).
    pub fenced: u64,
}

/// A histogram as (value, count) pairs of its recorded buckets.
pub fn to_pairs(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

/// An empty histogram with the workers' bounds and 3 significant figures.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// Adds (value, count) pairs to `h`.
pub fn add_pairs(h: &mut Histogram<u64>, pairs: &[(u64, u64)]) {
    for &(value, count) in pairs {
        h.saturating_record_n(value.clamp(1, MAX_LATENCY_US), count);
    }
}

/// Current wall time in milliseconds since the Unix epoch.
pub fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_keeps_percentiles() {
        let mut h = histogram();
        for v in 1..=10_000u64 {
            h.record(v * 7).unwrap();
        }
        let mut back = histogram();
        add_pairs(&mut back, &to_pairs(&h));
        assert_eq!(back.len(), h.len());
        for q in [0.5, 0.99, 0.999, 1.0] {
            assert_eq!(back.value_at_quantile(q), h.value_at_quantile(q));
        }
    }

    #[test]
    fn lines_parse() {
        let line = serde_json::to_string(&Line::Ready).unwrap();
        assert!(matches!(serde_json::from_str(&line).unwrap(), Line::Ready));
        let sample = r#"{"kind":"sample","unix_ms":1.5,"shards":[{"claims":1,"claimed":2,"busy":3,"empty":4,"errors":5,"completed":6}]}"#;
        match serde_json::from_str(sample).unwrap() {
            Line::Sample { shards, .. } => assert_eq!(shards[0].completed, 6),
            other => panic!("{other:?}"),
        }
    }
}
