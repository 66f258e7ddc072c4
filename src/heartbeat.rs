//! What a worker's heartbeat says, and how long it holds: the worker writes
//! its row on each shard every [`HEARTBEAT_INTERVAL`] with its counters for
//! that shard ([`ShardCountersSnapshot`]); readers (the client's worker
//! list, the dashboard, another worker giving back a silent one's jobs)
//! judge it by [`HEARTBEAT_TTL`]. A leaf: the worker, the telemetry, the
//! store and the client all use it, and it uses none of them.

use std::time::Duration;

/// How often a worker writes its row on each shard: often enough that the
/// dashboard's counters are fresh, rare enough to cost nothing (one small
/// upsert per process and shard).
#[cfg_attr(not(feature = "internal"), allow(unreachable_pub))]
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// A worker silent this long (before another worker's previous beat on the
/// same shard, so an unreachable shard does not count) stopped without
/// saying so, and its running jobs are given back: three missed beats, so
/// one slow beat is not taken for a dead worker, and a killed worker's jobs
/// run again within about 20 s instead of their lease (60 s by default). A
/// worker that was alive after all finds its late completions fenced.
#[cfg_attr(not(feature = "internal"), allow(unreachable_pub))]
pub const HEARTBEAT_TTL: Duration = Duration::from_secs(15);

/// A copy of one shard's counters.
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
    /// Attempts whose end was written (succeeded, retrying, dead,
    /// cancelled); jobs released unstarted are not counted.
    pub completed: u64,
    /// Time spent in claim statements (every answer), in microseconds:
    /// over `claims + busy + empty + errors`, the mean time of one claim.
    /// Zero when read from a report of a worker older than this field.
    #[serde(default)]
    pub claim_us: u64,
}

impl ShardCountersSnapshot {
    /// Claim statements of every answer: with jobs, busy, empty or failed.
    pub fn attempts(&self) -> u64 {
        self.claims + self.busy + self.empty + self.errors
    }
}
