//! The one store of a worker's counters, gauges and latencies, and the one
//! record call per event.

use super::counters::{ShardCounters, TargetCounters};
use super::latencies::{micros, Latencies};
use super::snapshot::StatsSnapshot;
use crate::heartbeat::ShardCountersSnapshot;
use crate::shards::ShardError;
use crate::store::jobs::{Claim, Written};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

/// Live telemetry of one worker process: read the totals with
/// [`Stats::snapshot`], the per-shard counters with [`Stats::shards`], the
/// latency histograms with [`Stats::latencies`]. Each counter is kept once
/// (per shard, or per shard and queue); totals are sums.
#[derive(Debug)]
pub struct Stats {
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
    /// Outcomes at the completer not yet written (nor fenced, nor given up).
    pub(crate) unwritten: AtomicU64,
    /// The most `unwritten` has been.
    unwritten_peak: AtomicU64,
    /// Longest a producer waited on one claim, in µs (see `shard_health`).
    claim_wait_max_us: AtomicU64,
    latencies: Mutex<Latencies>,
}

impl Stats {
    /// Counters for `shards` shards, all zero.
    pub fn new(shards: usize) -> Stats {
        Stats::for_queues(shards, Vec::new())
    }

    /// Counters for `shards` shards and, per shard, these queues (targets
    /// numbered shard-major, queues in this order).
    pub(crate) fn for_queues(shards: usize, queues: Vec<String>) -> Stats {
        Stats {
            shards: (0..shards).map(|_| ShardCounters::default()).collect(),
            targets: (0..shards * queues.len())
                .map(|_| TargetCounters::default())
                .collect(),
            queues,
            buffered: AtomicI64::new(0),
            running: AtomicI64::new(0),
            unwritten: AtomicU64::new(0),
            unwritten_peak: AtomicU64::new(0),
            claim_wait_max_us: AtomicU64::new(0),
            latencies: Mutex::new(Latencies::new(shards)),
        }
    }

    /// Per-shard counters.
    #[doc(hidden)]
    pub fn shards(&self) -> Vec<ShardCountersSnapshot> {
        self.shards.iter().map(ShardCounters::snapshot).collect()
    }

    /// The latency histograms so far.
    #[doc(hidden)]
    pub fn latencies(&self) -> Latencies {
        self.latencies.lock().expect("latency lock").clone()
    }

    /// Claims on shard `shard` not answered within its budget so far (the
    /// producer moved on; the shard was skipped until its probe answered).
    pub fn claims_detached_on(&self, shard: usize) -> u64 {
        self.shards[shard].detached.load(Relaxed)
    }

    /// One claim attempt on target `target` (shard × queue, in
    /// `worker.queues` order) of shard `shard` that took `took`. Hidden: it
    /// takes the driver layer's types (for the workspace's benchmarks).
    #[doc(hidden)]
    pub fn record_claim(
        &self,
        shard: usize,
        target: usize,
        result: &Result<Claim, ShardError>,
        took: Duration,
    ) {
        let per_shard = &self.shards[shard];
        let per_target = self.targets.get(target);
        let (shard_counter, target_counter) = match result {
            Ok(Claim::Jobs(jobs)) => {
                let n = jobs.len() as u64;
                per_shard.claimed.fetch_add(n, Relaxed);
                if let Some(t) = per_target {
                    t.claimed.fetch_add(n, Relaxed);
                    // Only a worker's own targets feed its buffer.
                    self.buffered.fetch_add(n as i64, Relaxed);
                }
                (&per_shard.claims, per_target.map(|t| &t.claims))
            }
            Ok(Claim::Busy) => (&per_shard.busy, per_target.map(|t| &t.busy)),
            Ok(Claim::Empty | Claim::HeldBack(_)) => {
                (&per_shard.empty, per_target.map(|t| &t.empty))
            }
            Err(_) => (&per_shard.errors, per_target.map(|t| &t.errors)),
        };
        shard_counter.fetch_add(1, Relaxed);
        per_shard
            .claim_us
            .fetch_add(took.as_micros().min(u128::from(u64::MAX)) as u64, Relaxed);
        if let Some(t) = per_target {
            target_counter
                .expect("a target's counter")
                .fetch_add(1, Relaxed);
            t.claim_duration.record(took);
        }
        let mut l = self.latencies.lock().expect("latency lock");
        if let Some(h) = l.claim_statement_us.get_mut(shard) {
            h.saturating_record(micros(took));
        }
    }

    /// A producer waited `waited` on one claim.
    pub(crate) fn record_claim_wait(&self, waited: Duration) {
        let us = waited.as_micros().min(u128::from(u64::MAX)) as u64;
        self.claim_wait_max_us.fetch_max(us, Relaxed);
    }

    /// A claim on shard `shard` not answered within its budget.
    pub(crate) fn record_detached(&self, shard: usize) {
        self.shards[shard].detached.fetch_add(1, Relaxed);
    }

    /// The dequeue slots (K) claims of `target` try now.
    pub(crate) fn record_slots(&self, target: usize, k: u32) {
        if let Some(t) = self.targets.get(target) {
            t.slots.store(u64::from(k), Relaxed);
        }
    }

    /// One completion statement on shard `shard` wrote `written`; `lags`
    /// are its jobs' handler-end → written times (none for jobs given back
    /// unstarted outside the completer). Whoever writes outcomes (the
    /// completer, the leaser, a producer giving back a late claim, the
    /// benchmark) calls this once per statement. Hidden: it takes the
    /// driver layer's types (for the workspace's benchmarks).
    #[doc(hidden)]
    pub fn record_written(
        &self,
        shard: usize,
        written: &Written,
        lags: impl IntoIterator<Item = Duration>,
    ) {
        let s = &self.shards[shard];
        let o = &s.outcomes;
        for (counter, n) in [
            (&o.succeeded, written.succeeded),
            (&o.retrying, written.retrying),
            (&o.dead, written.dead),
            (&o.cancelled, written.cancelled),
            (&o.released, written.released),
            (&o.fenced, written.fenced),
            (&o.statements, 1),
        ] {
            counter.fetch_add(n, Relaxed);
        }
        let mut lags = lags.into_iter().peekable();
        if lags.peek().is_none() {
            return;
        }
        let mut l = self.latencies.lock().expect("latency lock");
        for lag in lags {
            s.completion_lag.record(lag);
            l.completion_lag_us.saturating_record(micros(lag));
        }
    }

    /// `n` expired leases recovered on shard `shard`.
    pub(crate) fn record_recovered(&self, shard: usize, n: u64) {
        if let Some(s) = self.shards.get(shard) {
            s.outcomes.recovered.fetch_add(n, Relaxed);
        }
    }

    /// A handler abandoned on shard `shard`.
    pub(crate) fn record_abandoned(&self, shard: usize) {
        if let Some(s) = self.shards.get(shard) {
            s.outcomes.abandoned.fetch_add(1, Relaxed);
        }
    }

    /// `n` buffered jobs left the buffer (started, or given back unstarted).
    pub(crate) fn record_unbuffered(&self, n: usize) {
        self.buffered.fetch_sub(n as i64, Relaxed);
    }

    /// A handler of `queue` on shard `shard` started `waited` after its
    /// job was enqueued.
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

    /// A handler started (`true`) or ended (`false`).
    pub(crate) fn record_handler_running(&self, running: bool) {
        self.running
            .fetch_add(if running { 1 } else { -1 }, Relaxed);
    }

    /// `n` outcomes reached the completer, to be written.
    pub(crate) fn record_outcomes_arrived(&self, n: u64) {
        let now = self.unwritten.fetch_add(n, Relaxed) + n;
        self.unwritten_peak.fetch_max(now, Relaxed);
    }

    /// `n` outcomes at the completer were written, fenced or given up.
    pub(crate) fn record_outcomes_settled(&self, n: u64) {
        self.unwritten.fetch_sub(n, Relaxed);
    }

    /// The counters of `queue` on shard `shard`, when this worker serves it.
    /// A linear search: a worker serves a handful of queues.
    fn target(&self, shard: usize, queue: &str) -> Option<&TargetCounters> {
        let q = self.queues.iter().position(|name| name == queue)?;
        self.targets.get(shard * self.queues.len() + q)
    }

    /// Reads every counter; the totals are sums over the shards.
    pub fn snapshot(&self) -> StatsSnapshot {
        let sum = |pick: fn(&ShardCounters) -> &AtomicU64| -> u64 {
            self.shards.iter().map(|s| pick(s).load(Relaxed)).sum()
        };
        StatsSnapshot {
            claimed: sum(|s| &s.claimed),
            busy: sum(|s| &s.busy),
            empty: sum(|s| &s.empty),
            claim_errors: sum(|s| &s.errors),
            claim_statements: sum(|s| &s.claims),
            succeeded: sum(|s| &s.outcomes.succeeded),
            retrying: sum(|s| &s.outcomes.retrying),
            dead: sum(|s| &s.outcomes.dead),
            cancelled: sum(|s| &s.outcomes.cancelled),
            fenced: sum(|s| &s.outcomes.fenced),
            completion_statements: sum(|s| &s.outcomes.statements),
            recovered: sum(|s| &s.outcomes.recovered),
            released: sum(|s| &s.outcomes.released),
            abandoned: sum(|s| &s.outcomes.abandoned),
            claim_wait_max_us: self.claim_wait_max_us.load(Relaxed),
            claims_detached: sum(|s| &s.detached),
            unwritten: self.unwritten.load(Relaxed),
            unwritten_peak: self.unwritten_peak.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_batch_is_counted_once_and_every_reader_agrees() {
        let stats = Stats::for_queues(2, vec!["q".into()]);
        let written = Written {
            succeeded: 3,
            released: 1,
            fenced: 2,
            ..Written::default()
        };
        stats.record_written(1, &written, [Duration::from_millis(1)]);
        let totals = stats.snapshot();
        assert_eq!(
            (totals.succeeded, totals.released, totals.fenced),
            (3, 1, 2)
        );
        assert_eq!(totals.completion_statements, 1);
        assert_eq!(totals.finished(), 3);
        let shards = stats.shards();
        // Released jobs are still to run: not completed.
        assert_eq!((shards[0].completed, shards[1].completed), (0, 3));
        assert_eq!(stats.latencies().completion_lag_us.len(), 1);
    }

    #[test]
    fn a_claim_counts_in_its_shard_its_target_and_the_totals_once() {
        let stats = Stats::for_queues(2, vec!["a".into(), "b".into()]);
        // Target 3 is shard 1, queue b.
        stats.record_claim(1, 3, &Ok(Claim::Busy), Duration::from_millis(2));
        assert_eq!(stats.snapshot().busy, 1);
        assert_eq!(stats.shards()[1].busy, 1);
        assert_eq!(stats.shards()[0].busy, 0);
        assert_eq!(stats.shards()[1].claim_us, 2_000);
        assert_eq!(stats.targets[3].busy.load(Relaxed), 1);
        assert_eq!(stats.targets[3].claim_duration.count(), 1);
        assert_eq!(stats.latencies().claim_statement_us[1].len(), 1);
    }
}
