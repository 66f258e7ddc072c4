//! The per-shard counters and latencies of [`Stats`](super::Stats).

pub use crate::telemetry::{Latencies, ShardCountersSnapshot};
