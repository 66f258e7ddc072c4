//! Replies of claims that ran out of their budget (see [`super::shard_health`]):
//! handled by a task of their own whenever they come.

use super::claim_task::{joined, unheld};
use super::local_gate::Entered;
use super::permits::Reservation;
use super::producers::Producers;
use super::rate_starts::give_back_starts;
use crate::job::{ClaimedJob, Completion, Outcome};
use crate::shards::ShardError;
use crate::store::jobs::{self, Claim, CompleteMany};
use futures_util::FutureExt;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;
use std::time::Instant;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The reply of a claim that ran out of its budget, whenever it comes
/// (within the statement deadline): its jobs run when the process has room
/// for them now, and go back to the queue otherwise (fenced release); a
/// claim that got no answer at all is noted as lost, so that the leaser
/// gives back what it may have left this process owning. The gate permit
/// (`entered`) stays taken until then.
pub(crate) async fn late_reply(
    p: Arc<Producers>,
    claim: JoinHandle<Result<Claim, ShardError>>,
    (entered, permits, starts): (Entered, Reservation, Option<u32>),
    target: usize,
    started: Instant,
    shutdown: CancellationToken,
) {
    let (result, _) = unheld(joined(claim.await));
    let now = Instant::now();
    let took = now - started;
    let shard_index = p.targets[target].shard;
    p.run.stats.record_claim(shard_index, target, &result, took);
    if result.is_ok() {
        p.run.health.with(shard_index, |h| h.answered(took));
    }
    let mut rng = StdRng::from_entropy();
    if let Some(starts) = starts {
        let used = match &result {
            Ok(Claim::Jobs(jobs)) => jobs.len() as u32,
            _ => 0,
        };
        give_back_starts(&p, &p.targets[target].queue, starts.saturating_sub(used));
    }
    match result {
        Ok(Claim::Jobs(jobs)) => {
            // A late answer says nothing about the usual claim time.
            entered.claimed(jobs.len(), took.min(p.config.claim_budget_max));
            drop(entered);
            take_late(&p, jobs, permits, &shutdown).await;
        }
        Ok(Claim::Busy) => entered.busy(now, &mut rng),
        Ok(Claim::Empty) => entered.empty(now, &mut rng),
        Ok(Claim::HeldBack(_)) => unreachable!("unheld() made it Jobs or Empty"),
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

/// Runs the jobs of a late reply if their credits are free now, else gives
/// them back. Never waits for credits: the producers' claims, which were
/// made in time, come first.
async fn take_late(
    p: &Producers,
    mut jobs: Vec<ClaimedJob>,
    mut permits: Reservation,
    shutdown: &CancellationToken,
) {
    let n = jobs.len();
    let credits = match shutdown.is_cancelled() {
        true => None,
        false => p.credits.take(n as u32).now_or_never(),
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

/// Releases `jobs` (claimed, never started) at once, fenced. When that
/// fails, the claim is noted as lost: the leaser then gives them back, or
/// their leases expire.
async fn give_back_late(p: &Producers, jobs: Vec<ClaimedJob>) {
    let Some(first) = jobs.first() else {
        return;
    };
    let shard = p.run.shards.get(first.shard);
    p.run.stats.record_unbuffered(jobs.len());
    let done: Vec<Completion> = jobs
        .iter()
        .map(|job| Completion::of(job, Outcome::Released))
        .collect();
    let release = CompleteMany {
        owner: &p.run.owner,
        retry: p.config.retry,
        done: &done,
    };
    match jobs::complete_many(shard, release).await {
        Ok(written) => {
            p.run.stats.record_written(shard.index, &written, []);
            tracing::info!(shard = %shard.name, released = written.released, "gave back the jobs of a late claim reply");
        }
        Err(err) => {
            p.run.lost_claims.lost(shard.index);
            tracing::warn!(
                shard = %shard.name,
                jobs = done.len(),
                error = %crate::error_chain::error_chain(&err),
                "cannot give back the jobs of a late claim reply; the leaser will"
            );
        }
    }
}
