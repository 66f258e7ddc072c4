//! The counters of one shard and of one (shard, queue) target.

use super::histogram::LatencyHistogram;
use crate::heartbeat::ShardCountersSnapshot;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters of one shard, as seen by this worker.
#[derive(Debug, Default)]
pub(crate) struct ShardCounters {
    /// Claim statements that returned jobs.
    pub claims: AtomicU64,
    /// Jobs claimed.
    pub claimed: AtomicU64,
    /// Claims that found every dequeue slot taken (lock misses).
    pub busy: AtomicU64,
    /// Claims that found no ready job.
    pub empty: AtomicU64,
    /// Claims that failed.
    pub errors: AtomicU64,
    /// Time spent in claim statements, in microseconds.
    pub claim_us: AtomicU64,
    /// Claims not answered within the shard's budget (see `shard_health`).
    pub detached: AtomicU64,
    /// Outcomes written by kind, and the rest of what the worker learns
    /// about this shard's jobs.
    pub outcomes: OutcomeCounters,
    /// Handler end → outcome written.
    pub completion_lag: LatencyHistogram,
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
    /// Expired leases (of any worker) this process recovered.
    pub recovered: AtomicU64,
    /// Handlers abandoned after `worker.handler_timeout` (their attempts
    /// also count as retrying or dead).
    pub abandoned: AtomicU64,
    /// Completion statements.
    pub statements: AtomicU64,
}

impl OutcomeCounters {
    /// Attempts whose end was written: succeeded, retrying, dead or
    /// cancelled, as `Snapshot::finished`. Not the released jobs: they were
    /// given back unstarted (a late claim, shutdown) and are still to run,
    /// so a reader that waits for `completed` to reach the jobs enqueued
    /// (the scale bench) would stop with jobs left.
    pub(crate) fn finished(&self) -> u64 {
        [&self.succeeded, &self.retrying, &self.dead, &self.cancelled]
            .iter()
            .map(|c| c.load(Relaxed))
            .sum()
    }
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

impl ShardCounters {
    /// Reads every counter.
    pub(crate) fn snapshot(&self) -> ShardCountersSnapshot {
        ShardCountersSnapshot {
            claims: self.claims.load(Relaxed),
            claimed: self.claimed.load(Relaxed),
            busy: self.busy.load(Relaxed),
            empty: self.empty.load(Relaxed),
            errors: self.errors.load(Relaxed),
            completed: self.outcomes.finished(),
            claim_us: self.claim_us.load(Relaxed),
        }
    }
}
