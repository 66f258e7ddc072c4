//! The leaser: keeps the leases of every job this process holds (buffered,
//! running, or waiting to be written) alive, every third of the lease (a
//! failed extension is tried again at the next pass), and asks, every
//! second, which of them were cancelled: a running handler is told, an
//! unstarted job is released (and written as cancelled) instead of
//! run. Both go by the ids the process holds (primary-key probes), never by
//! walking the shard's running rows. A process that dies stops extending, and
//! its jobs are recovered once their leases expire.
//!
//! Each shard has its own loop: a shard that hangs delays only its own
//! statements (each has a deadline), never the leases on the others.

use super::per_shard::each_shard;
use super::worker_run::WorkerRun;
use crate::config::{Backoff, Config};
use crate::job::{Completion, Outcome};
use crate::shards::Shard;
use crate::store::jobs::{self, CompleteMany, ExtendLeases};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Extensions per lease period: a lease outlives an outage of its shard of up
/// to two of these periods (less a pass, see [`ExtensionClock`]).
const EXTENSIONS_PER_LEASE: u32 = 3;

/// How long, in statement deadlines after a claim lost its reply, the leaser
/// looks for jobs that claim left this process owning.
const ORPHAN_WINDOW_DEADLINES: u32 = 5;

/// How often held jobs are checked for cancellation: the longest a cancelled
/// handler keeps running unaware.
const CANCEL_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The leaser's settings, from [`Config`].
#[derive(Debug, Clone)]
pub(crate) struct LeaserConfig {
    /// Lease length (`worker.lease`).
    pub lease: Duration,
    /// Deadline of one statement (`database.statement_timeout_ms`).
    pub statement_timeout: Duration,
    /// Retry delays for the release of orphans (`worker.retry_backoff`).
    pub retry: Backoff,
}

impl LeaserConfig {
    pub(crate) fn new(config: &Config) -> Self {
        LeaserConfig {
            lease: config.worker.lease,
            statement_timeout: config.database.statement_timeout,
            retry: config.worker.retry_backoff,
        }
    }
}

/// Runs until `stop` is cancelled.
pub(crate) async fn run(config: LeaserConfig, run: Arc<WorkerRun>, stop: CancellationToken) {
    let config = Arc::new(config);
    each_shard(run.shards.len(), |index| {
        shard_loop(config.clone(), run.clone(), index, stop.clone())
    })
    .await;
}

/// One shard's extensions and cancellation polls.
async fn shard_loop(
    config: Arc<LeaserConfig>,
    run: Arc<WorkerRun>,
    index: usize,
    stop: CancellationToken,
) {
    let lease = config.lease;
    let mut clock = ExtensionClock::new(lease, Instant::now());
    let shard = run.shards.get(index).clone();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(clock.tick()) => {}
        }
        release_orphans(&config, &run, &shard).await;
        let held = run.running.on(index);
        if held.is_empty() {
            clock.nothing_held(Instant::now());
            continue;
        }
        if clock.due(Instant::now()) {
            let tried = Instant::now();
            let ok = extend(&run, &shard, &held, lease).await;
            clock.tried(tried, ok);
        }
        poll_cancellations(&run, &shard, &held).await;
    }
}

/// When a shard's held leases are extended next, without I/O: a third of the
/// lease after the last extension that succeeded, then at every pass until
/// one does. So a lease outlives an outage of its shard of up to two thirds
/// of the lease less a pass, whenever in the period the outage begins.
#[derive(Debug, Clone, Copy)]
struct ExtensionClock {
    every: Duration,
    tick: Duration,
    last: Instant,
}

impl ExtensionClock {
    fn new(lease: Duration, now: Instant) -> Self {
        let every = lease / EXTENSIONS_PER_LEASE;
        ExtensionClock {
            every,
            tick: CANCEL_POLL_INTERVAL.min(every),
            last: now,
        }
    }

    /// How long the loop sleeps between passes.
    fn tick(&self) -> Duration {
        self.tick
    }

    /// No job held: the next one claimed gets a whole period first.
    fn nothing_held(&mut self, now: Instant) {
        self.last = now;
    }

    /// Whether an extension is due at `now`.
    fn due(&self, now: Instant) -> bool {
        now.duration_since(self.last) >= self.every
    }

    /// An extension sent at `at` succeeded (`ok`) or failed. A failed one
    /// stays due, so it is tried again at the next pass (a tick later), not
    /// a period later: a period after a failed try can be the lease's end.
    fn tried(&mut self, at: Instant, ok: bool) {
        if ok {
            self.last = at;
        }
    }
}

/// After a claim on this shard lost its reply (it may have run anyway), for
/// a few statement deadlines: gives back the running jobs this process owns
/// there but never received, at once instead of after their lease. Jobs
/// claimed less than two deadlines ago are left alone: the reply of such a
/// claim may still be on its way (the client waits a deadline plus a
/// quarter for the whole claim).
///
/// The jobs this process holds are read both before and after the shard is
/// asked: a job whose outcome is written (and forgotten) while the question
/// is out was seen running by it, yet is no orphan; the earlier read still
/// holds it.
async fn release_orphans(config: &LeaserConfig, run: &WorkerRun, shard: &Shard) {
    let deadline = config.statement_timeout;
    let Some(lost) = run.lost_claims.last(shard.index) else {
        return;
    };
    if lost.elapsed() > deadline * ORPHAN_WINDOW_DEADLINES {
        return;
    }
    let mut held = run.running.ids_on(shard.index);
    let owned = match jobs::owned_running(shard, &run.owner, deadline * 2).await {
        Ok(owned) => owned,
        Err(err) => {
            tracing::debug!(shard = %shard.name, error = %crate::error_chain::error_chain(&err), "orphan check failed");
            return;
        }
    };
    held.extend(run.running.ids_on(shard.index));
    let orphans: Vec<Completion> = owned
        .into_iter()
        .filter(|o| !held.contains(&o.id))
        .map(|o| Completion {
            id: o.id,
            shard: shard.index,
            fence: o.fence,
            key: o.key,
            outcome: Outcome::Released,
            finished: Instant::now(),
            credited: false,
        })
        .collect();
    if orphans.is_empty() {
        return;
    }
    let release = CompleteMany {
        owner: &run.owner,
        retry: config.retry,
        done: &orphans,
    };
    match jobs::complete_many(shard, release).await {
        Ok(written) => {
            run.stats.record_written(shard.index, &written, []);
            tracing::info!(shard = %shard.name, released = written.released, "gave back jobs a lost claim reply left this process owning");
        }
        Err(err) => {
            tracing::debug!(shard = %shard.name, error = %crate::error_chain::error_chain(&err), "orphan release failed")
        }
    }
}

/// Extends the leases of `held` on `shard`; whether that succeeded.
async fn extend(
    run: &WorkerRun,
    shard: &Shard,
    held: &[(crate::job::JobId, i64)],
    lease: Duration,
) -> bool {
    let extension = ExtendLeases {
        owner: &run.owner,
        held,
        lease,
    };
    match jobs::extend_leases(shard, extension).await {
        Ok(_) => true,
        Err(err) => {
            tracing::warn!(shard = %shard.name, error = %crate::error_chain::error_chain(&err), "lease extension failed");
            false
        }
    }
}

async fn poll_cancellations(run: &WorkerRun, shard: &Shard, held: &[(crate::job::JobId, i64)]) {
    let ids: Vec<crate::job::JobId> = held.iter().map(|(id, _)| *id).collect();
    match jobs::cancel_requested(shard, &ids).await {
        Ok(ids) => ids.into_iter().for_each(|id| run.running.cancel(id)),
        Err(err) => {
            tracing::debug!(shard = %shard.name, error = %crate::error_chain::error_chain(&err), "cancellation check failed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard refuses from just before an extension is due until a little
    /// more than a period later: the first two tries fail. The lease (9 s,
    /// extended every 3 s) must be extended again before it runs out, as
    /// soon as the shard answers, not a whole period after the last failed
    /// try (that lands on the lease's end: the lease survived one failed
    /// extension, not two).
    #[test]
    fn a_failed_extension_is_tried_again_at_the_next_pass() {
        let lease = Duration::from_secs(9);
        let start = Instant::now();
        let mut clock = ExtensionClock::new(lease, start);
        // The lease as the shard last extended it, at `start`.
        let expires = start + lease;
        let refused = start + Duration::from_millis(2_900)..start + Duration::from_millis(6_500);
        // Each pass takes a little longer than a tick (its statements).
        let pass = clock.tick() + Duration::from_millis(20);
        let mut now = start;
        let mut extended_at = None;
        while now < expires && extended_at.is_none() {
            now += pass;
            if clock.due(now) {
                let ok = !refused.contains(&now);
                clock.tried(now, ok);
                if ok && now > refused.start {
                    extended_at = Some(now);
                }
            }
        }
        let at = extended_at.expect("an extension after the refusal");
        assert!(
            at < expires,
            "extended {:?} after the lease's end",
            at - expires
        );
        assert!(
            at < refused.end + clock.tick() * 2,
            "extended {:?} after the shard answered again",
            at - refused.end
        );
    }

    #[test]
    fn extensions_are_a_third_of_the_lease_apart_while_they_succeed() {
        let start = Instant::now();
        let mut clock = ExtensionClock::new(Duration::from_secs(6), start);
        assert!(!clock.due(start + Duration::from_millis(1_999)));
        assert!(clock.due(start + Duration::from_secs(2)));
        clock.tried(start + Duration::from_secs(2), true);
        assert!(!clock.due(start + Duration::from_secs(3)));
        assert!(clock.due(start + Duration::from_secs(4)));
    }
}
