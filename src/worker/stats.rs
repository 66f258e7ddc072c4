//! Counters shared by the worker's roles.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live counters of one worker process: read them with
/// [`Stats::snapshot`], the per-shard ones with [`Stats::shards`], the
/// latency histograms with [`Stats::latencies`].
#[derive(Debug, Default)]
pub struct Stats {
    /// Per-shard counters and latency histograms.
    pub(crate) metrics: super::metrics::Metrics,
    /// Jobs claimed.
    pub(crate) claimed: AtomicU64,
    /// Claim attempts that found every slot taken.
    pub(crate) busy: AtomicU64,
    /// Claim attempts that found no ready job.
    pub(crate) empty: AtomicU64,
    /// Claim attempts that failed (shard unreachable, statement error).
    pub(crate) claim_errors: AtomicU64,
    /// Claim statements that returned jobs.
    pub(crate) claim_statements: AtomicU64,
    /// Jobs written back as succeeded.
    pub(crate) succeeded: AtomicU64,
    /// Failed jobs written back for another attempt.
    pub(crate) retrying: AtomicU64,
    /// Failed jobs written back as dead (last attempt).
    pub(crate) dead: AtomicU64,
    /// Jobs written back as cancelled.
    pub(crate) cancelled: AtomicU64,
    /// Completions rejected by the fence (lease lost).
    pub(crate) fenced: AtomicU64,
    /// Completion statements executed.
    pub(crate) completion_statements: AtomicU64,
    /// Jobs returned to the queue by lease recovery.
    pub(crate) recovered: AtomicU64,
    /// Claimed jobs given back unstarted at shutdown.
    pub(crate) released: AtomicU64,
    /// Handlers abandoned after `worker.handler_timeout`.
    pub(crate) abandoned: AtomicU64,
    /// Longest a producer waited on one claim, in µs (see `shard_health`).
    pub(crate) claim_wait_max_us: AtomicU64,
    /// Claims not answered within their shard's budget, left to a task of
    /// their own while the producer moved on.
    pub(crate) claims_detached: AtomicU64,
    /// Outcomes at the completer not yet written (nor fenced, nor given up).
    pub(crate) unwritten: AtomicU64,
    /// The most [`Stats::unwritten`] has been.
    pub(crate) unwritten_peak: AtomicU64,
}

/// A point-in-time copy of [`Stats`].
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct StatsSnapshot {
    /// Jobs claimed.
    pub claimed: u64,
    /// Busy answers.
    pub busy: u64,
    /// Empty answers.
    pub empty: u64,
    /// Failed claims.
    pub claim_errors: u64,
    /// Claim statements that returned jobs.
    pub claim_statements: u64,
    /// Succeeded jobs written.
    pub succeeded: u64,
    /// Failed jobs scheduled for another attempt.
    pub retrying: u64,
    /// Failed jobs that are dead.
    pub dead: u64,
    /// Cancelled jobs.
    pub cancelled: u64,
    /// Fenced-out completions.
    pub fenced: u64,
    /// Completion statements.
    pub completion_statements: u64,
    /// Recovered jobs.
    pub recovered: u64,
    /// Released jobs.
    pub released: u64,
    /// Abandoned handlers.
    pub abandoned: u64,
    /// Longest a producer waited on one claim, in µs: at most the budget
    /// of that claim's shard (a few hundred ms) and the time to give up.
    pub claim_wait_max_us: u64,
    /// Claims not answered within their shard's budget (their replies are
    /// handled by a task of their own: jobs run or go back).
    pub claims_detached: u64,
    /// Outcomes at the completer not yet written now.
    pub unwritten: u64,
    /// The most outcomes that ever waited at the completer at once.
    pub unwritten_peak: u64,
}

impl StatsSnapshot {
    /// Attempts whose outcome was written: succeeded, retrying, dead or cancelled.
    pub fn finished(&self) -> u64 {
        self.succeeded + self.retrying + self.dead + self.cancelled
    }
}

impl Stats {
    /// Counters for `shards` shards, all zero.
    pub fn new(shards: usize) -> Stats {
        Stats::for_queues(shards, Vec::new())
    }

    /// Counters for `shards` shards and, per shard, these queues.
    pub(crate) fn for_queues(shards: usize, queues: Vec<String>) -> Stats {
        Stats {
            metrics: super::metrics::Metrics::new(shards, queues),
            ..Stats::default()
        }
    }

    /// Per-shard counters.
    pub fn shards(&self) -> Vec<super::metrics::ShardCountersSnapshot> {
        self.metrics.shard_snapshots()
    }

    /// The latency histograms so far.
    pub fn latencies(&self) -> super::metrics::Latencies {
        self.metrics.latencies()
    }

    /// Counts one claim attempt on target `target` (shard × queue, in
    /// `worker.queues` order) of shard `shard` that took `took`: in the
    /// totals, the shard's counters and the target's.
    pub fn record_claim(
        &self,
        shard: usize,
        target: usize,
        result: &Result<crate::store::jobs::Claim, crate::shards::ShardError>,
        took: std::time::Duration,
    ) {
        use crate::store::jobs::Claim;
        let per_shard = &self.metrics.shards[shard];
        match result {
            Ok(Claim::Jobs(jobs)) => {
                let n = jobs.len() as u64;
                Self::add(&self.claimed, n);
                Self::add(&self.claim_statements, 1);
                Self::add(&per_shard.claimed, n);
                Self::add(&per_shard.claims, 1);
            }
            Ok(Claim::Busy) => {
                Self::add(&self.busy, 1);
                Self::add(&per_shard.busy, 1);
            }
            Ok(Claim::Empty) => {
                Self::add(&self.empty, 1);
                Self::add(&per_shard.empty, 1);
            }
            Err(_) => {
                Self::add(&self.claim_errors, 1);
                Self::add(&per_shard.errors, 1);
            }
        }
        self.metrics.record_claim_statement(shard, took);
        self.metrics.record_target_claim(target, result, took);
    }

    /// A producer waited `waited` on one claim.
    pub(crate) fn record_claim_wait(&self, waited: std::time::Duration) {
        let us = waited.as_micros().min(u128::from(u64::MAX)) as u64;
        self.claim_wait_max_us.fetch_max(us, Relaxed);
    }

    /// Counts a claim on shard `shard` not answered within its budget.
    pub(crate) fn record_detached(&self, shard: usize) {
        Self::add(&self.claims_detached, 1);
        Self::add(&self.metrics.shards[shard].detached, 1);
    }

    /// Claims on shard `shard` not answered within its budget so far (the
    /// producer moved on; the shard was skipped until its probe answered).
    pub fn claims_detached_on(&self, shard: usize) -> u64 {
        self.metrics.shards[shard].detached.load(Relaxed)
    }

    /// Counts a written batch of completions.
    pub fn add_written(&self, w: &crate::store::jobs::Written) {
        Self::add(&self.completion_statements, 1);
        Self::add(&self.succeeded, w.succeeded);
        Self::add(&self.retrying, w.retrying);
        Self::add(&self.dead, w.dead);
        Self::add(&self.cancelled, w.cancelled);
        Self::add(&self.released, w.released);
        Self::add(&self.fenced, w.fenced);
    }

    /// Counts `n` expired leases recovered on shard `shard`.
    pub(crate) fn record_recovered(&self, shard: usize, n: u64) {
        Self::add(&self.recovered, n);
        self.metrics.record_recovered(shard, n);
    }

    /// Counts `n` completions written on shard `shard`.
    pub fn record_completed(&self, shard: usize, n: u64) {
        Self::add(&self.metrics.shards[shard].completed, n);
    }

    /// `n` outcomes reached the completer, to be written.
    pub(crate) fn outcomes_arrived(&self, n: u64) {
        let now = self.unwritten.fetch_add(n, Relaxed) + n;
        self.unwritten_peak.fetch_max(now, Relaxed);
    }

    /// `n` outcomes at the completer were written, fenced or given up.
    pub(crate) fn outcomes_settled(&self, n: u64) {
        self.unwritten.fetch_sub(n, Relaxed);
    }

    /// Adds `n` to `counter`.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            claimed: self.claimed.load(Relaxed),
            busy: self.busy.load(Relaxed),
            empty: self.empty.load(Relaxed),
            claim_errors: self.claim_errors.load(Relaxed),
            claim_statements: self.claim_statements.load(Relaxed),
            succeeded: self.succeeded.load(Relaxed),
            retrying: self.retrying.load(Relaxed),
            dead: self.dead.load(Relaxed),
            cancelled: self.cancelled.load(Relaxed),
            fenced: self.fenced.load(Relaxed),
            completion_statements: self.completion_statements.load(Relaxed),
            recovered: self.recovered.load(Relaxed),
            released: self.released.load(Relaxed),
            abandoned: self.abandoned.load(Relaxed),
            claim_wait_max_us: self.claim_wait_max_us.load(Relaxed),
            claims_detached: self.claims_detached.load(Relaxed),
            unwritten: self.unwritten.load(Relaxed),
            unwritten_peak: self.unwritten_peak.load(Relaxed),
        }
    }
}
