//! A worker's telemetry, kept once: every event (a claim, a batch of outcomes
//! written, a recovery, ...) is one call on [`Stats`], which updates the one
//! set of counters it belongs to. Everything else is read from those: the
//! totals of [`Stats::snapshot`] (and so `WorkerReport`) are sums over the
//! shards, a shard's `completed` is the sum of its written outcomes, and the
//! Prometheus exposition (`crate::prometheus`) reads the same atomics.
//!
//! On the per-job path recording is relaxed atomics only (no lock, no
//! allocation), except the hdrhistogram copies of the latencies, which take
//! one short lock per batch.

mod counters;
pub(crate) mod histogram;
mod latencies;
mod snapshot;
mod stats;

#[cfg_attr(not(feature = "internal"), allow(unreachable_pub))]
pub use crate::heartbeat::ShardCountersSnapshot;
pub(crate) use counters::{OutcomeCounters, ShardCounters, TargetCounters};
#[cfg_attr(not(feature = "internal"), allow(unused_imports, unreachable_pub))]
pub use latencies::Latencies;
pub use snapshot::StatsSnapshot;
pub use stats::Stats;
