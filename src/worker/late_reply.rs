//! Replies of claims that ran out of their budget (see [`super::shard_health`]):
//! handled by a task of their own whenever they come.

use super::claim_task::joined;
use super::credits::Credits;
use super::local_gate::Entered;
use super::permits::Reservation;
use super::producers::Producers;
use super::settle::{settle, Reply};
use crate::job::{ClaimedJob, Completion};
use crate::shards::ShardError;
use crate::store::jobs::Claim;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;
use std::time::Instant;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Latest a late reply's jobs are held, counted from the claim's sending,
/// as a fraction of their lease: the leaser extends held leases every
/// third of the lease, so a lease half gone when its job is held is still
/// extended before it runs out.
const HELD_WITHIN_LEASE_DIVISOR: u32 = 2;

/// What a claim past its budget leaves to the task that takes its reply.
pub(crate) struct LateClaim {
    pub claim: JoinHandle<Result<Claim, ShardError>>,
    /// The gate permit, taken until the reply.
    pub entered: Entered,
    /// The queue's permits reserved for its jobs (limited queues).
    pub permits: Reservation,
    /// Starts taken from the queue's rate (rate-limited queues).
    pub starts: Option<u32>,
    /// The claim's buffer credits, when it took them along (see the
    /// producer's `credits_for_late_reply`); else its jobs wait for room.
    pub credits: Option<Credits>,
    pub target: usize,
    /// When the claim was sent.
    pub started: Instant,
    /// A last-resort claim on a suspect shard (see `shard_health`).
    pub last_resort: bool,
}

/// The reply of a claim that ran out of its budget, whenever it comes
/// (within the statement deadline): its jobs run (see [`take_late`]); a
/// claim that got no answer at all is noted as lost, so that the leaser
/// gives back what it may have left this process owning.
pub(crate) async fn late_reply(p: Arc<Producers>, late: LateClaim, shutdown: CancellationToken) {
    let LateClaim {
        claim,
        entered,
        permits,
        starts,
        credits,
        target,
        started,
        last_resort,
    } = late;
    let result = joined(claim.await);
    let now = Instant::now();
    let took = now - started;
    let shard_index = p.targets[target].shard;
    settle(&p, target, &result, took, Reply::Late, last_resort, starts);
    let mut rng = StdRng::from_entropy();
    match result {
        Ok(claim) if !claim.jobs().is_empty() => {
            let jobs = claim.into_jobs();
            // A late answer says nothing about the usual claim time.
            entered.claimed(jobs.len(), took.min(p.config.claim_budget_max));
            drop(entered);
            take_late(&p, jobs, permits, credits, started, &shutdown).await;
        }
        Ok(Claim::Busy) => entered.busy(now, &mut rng),
        // Empty, or held back with no job taken.
        Ok(_) => entered.empty(now, &mut rng),
        Err(err) => {
            if err.kind().may_have_run() {
                p.run.lost_claims.lost(shard_index);
            }
            tracing::debug!(
                shard = %p.run.shards.get(shard_index).name,
                error = %crate::error_chain::error_chain(&err),
                "a claim past its budget failed"
            );
        }
    }
}

/// Runs the jobs of a late reply: their leases are fresh, and giving them
/// back rewrites their rows (running → queued), a dead version each, which
/// slows the very claims that came late. With the claim's own credits when
/// it kept them, else once room frees (the producers' claims wait behind
/// it), by [`HELD_WITHIN_LEASE_DIVISOR`] of the lease at the latest, a
/// reply per producer at a time. Given back only when no room came by then,
/// when as many replies already wait, or at shutdown.
async fn take_late(
    p: &Producers,
    mut jobs: Vec<ClaimedJob>,
    mut permits: Reservation,
    credits: Option<Credits>,
    started: Instant,
    shutdown: &CancellationToken,
) {
    let n = jobs.len();
    let credits = match (shutdown.is_cancelled(), credits) {
        (true, _) => None,
        (false, Some(credits)) => Some(credits),
        // Beyond the buffer, a batch per producer at most waits (what the
        // credits bound, memory and jobs held, stays bounded).
        (false, None) => match p.late_waiting.try_acquire() {
            Ok(_waiting) => {
                let hold_by = started + p.config.lease / HELD_WITHIN_LEASE_DIVISOR;
                room_for(p, n, hold_by, shutdown).await
            }
            Err(_) => None,
        },
    };
    let Some(credits) = credits else {
        return give_back_late(p, jobs).await;
    };
    let claim = p.next_claim();
    for job in &mut jobs {
        job.claim = claim;
        p.run.running.hold(job, permits.take());
    }
    drop(permits);
    let undispatched = p.dispatch.send_all(jobs, shutdown).await;
    credits.keep(n - undispatched.len());
    if !undispatched.is_empty() {
        p.run
            .running
            .forget(undispatched.iter().map(|j| (j.id, j.fence)));
        give_back_late(p, undispatched).await;
    }
}

/// Credits for `n` jobs once they are free, waiting until `by` at the
/// latest; `None` past it or at shutdown.
async fn room_for(
    p: &Producers,
    n: usize,
    by: Instant,
    shutdown: &CancellationToken,
) -> Option<Credits> {
    let take = p.credits.take(n as u32);
    tokio::select! {
        _ = shutdown.cancelled() => None,
        taken = tokio::time::timeout_at(by.into(), take) => taken.ok(),
    }
}

/// Releases `jobs` (claimed, never started) through the completer, like
/// every outcome: written there, fenced, with its retries. They hold no
/// buffer credits (they found no room), so their outcomes give none back.
async fn give_back_late(p: &Producers, jobs: Vec<ClaimedJob>) {
    if jobs.is_empty() {
        return;
    }
    p.run.stats.record_unbuffered(jobs.len());
    tracing::info!(
        jobs = jobs.len(),
        "giving back the jobs of a late claim reply (no room for them)"
    );
    for job in &jobs {
        let done = Completion::given_back_without_room(job);
        if p.dispatch.given_back.send(done).await.is_err() {
            // The completer is gone (only after every producer): the jobs
            // return when their leases expire.
            return;
        }
    }
}
