//! Producers: claim batches while rotating over the targets (shard × queue),
//! and hand the jobs to the executor slots. A producer claims only when the
//! process has room for a whole batch (it takes the batch's buffer credits
//! first and keeps one per job claimed).
//!
//! A producer waits on one claim no longer than its shard's budget
//! ([`super::shard_health`]); a claim past it is left to a task of its own
//! ([`super::late_reply`]), the shard is skipped by every producer until its
//! probe ([`super::probe`]) answers in time, and the producer moves on at
//! once; the late reply keeps the claim's credits, so that its jobs run,
//! and the producer takes fresh ones. What the producers share is in
//! [`super::producers`].

use super::claim_task::{fails_the_shard, joined, spawn_claim};
use super::credits::Credits;
use super::late_reply::{late_reply, LateClaim};
use super::local_gate::Entered;
use super::permits::Reservation;
use super::probe::probe;
use super::producers::Producers;
use super::rate_starts::take_starts;
use super::refusals::{AfterRefusal, Refusals};
use super::rotation::{Next, Rotation};
use super::settle::{settle, Reply};
use super::shard_health::{Health, SUSPECT_RECHECK};
use super::target::Target;
use crate::config::DequeueMode;
use crate::job::ClaimedJob;
use crate::store::jobs::Claim;
use futures_util::FutureExt;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How soon a target whose queue had no permit free is visited again: the
/// permit leaser asks for more meanwhile (at most every 50 ms), and jobs
/// finishing free some.
const LIMIT_RECHECK: Duration = Duration::from_millis(20);

/// One producer's loop; returns at shutdown, with the jobs it claimed but
/// could not dispatch any more (to be released).
pub(crate) async fn run(producers: Arc<Producers>, shutdown: CancellationToken) -> Vec<ClaimedJob> {
    let p = &producers;
    let mut rotation = p.rotation();
    loop {
        // Taken by `claim_somewhere`; at shutdown they drop unused and go back.
        let mut credits = None;
        let Some((mut jobs, mut permits)) =
            claim_somewhere(p, &mut rotation, &mut credits, &shutdown).await
        else {
            return Vec::new();
        };
        credits
            .expect("a claim is made with credits")
            .keep(jobs.len());
        let claim = p.next_claim();
        for job in &mut jobs {
            job.claim = claim;
            p.run.running.hold(job, permits.take());
        }
        drop(permits);
        let undispatched = p.dispatch.send_all(jobs, &shutdown).await;
        if !undispatched.is_empty() {
            return undispatched;
        }
    }
}

/// Shows the K of `target` in the worker's metrics.
fn publish_slots(p: &Producers, target: usize, entered: &Entered) {
    if let Some(k) = entered.slots_now() {
        p.run.stats.record_slots(target, k);
    }
}

/// Marks shard `shard` suspect for the whole process; the producer that
/// made it so starts its one probe.
fn suspect(p: &Arc<Producers>, shard: usize, shutdown: &CancellationToken) {
    if p.run.health.with(shard, |h| h.suspect(Instant::now())) {
        tracing::warn!(
            shard = %p.run.shards.get(shard).name,
            budget_ms = p.run.health.budget(shard).as_millis() as u64,
            "shard did not answer in time; every producer skips it until a probe answers \
             (while it answers late, it is still claimed from when nothing else has work)"
        );
        p.spawn(probe(p.clone(), shard, shutdown.clone()));
    }
}

/// The first target of a shard that a probe just found well again, if any:
/// the process's next claim goes there, so that the shard is used again
/// within one claim interval rather than at its turn in the rotation. With
/// claims of 500 and 50 ms jobs a process claims about once per 1.6 s, so
/// a turn among four shards came 3 s or more after the recovery (bench
/// round 9). One claim only: the rotation goes on from there.
fn recovered_target(p: &Producers) -> Option<usize> {
    let shard = p.run.health.take_recovered()?;
    p.targets.iter().position(|t| t.shard == shard)
}

/// The credits of a claim past its budget, for its late reply, so that
/// its jobs have room and never go back for the lack of it: the producer's
/// own, when fresh ones are free now (the producer goes on with those) or
/// when the buffer has room for a batch beside every producer's late claim
/// (the producer then waits for fresh ones: the buffer is full of jobs that
/// run, not of a silent shard's claims). Else none: in a buffer that small
/// a silent shard's claim would keep the producer's room until its
/// deadline; the reply then waits for room (see `late_reply`).
fn credits_for_late_reply(p: &Producers, credits: &mut Option<Credits>) -> Option<Credits> {
    if let Some(fresh) = p.credits.take(p.config.batch_size).now_or_never() {
        return credits.replace(fresh);
    }
    p.config
        .room_beside_late_claims()
        .then(|| credits.take())
        .flatten()
}

/// Visits targets until one yields jobs, with the permits reserved for
/// them (their queue's, when limited); `None` at shutdown. `credits` are
/// the room for them, taken here first (and again when a claim past its
/// budget took them along: see [`credits_for_late_reply`]).
async fn claim_somewhere(
    p: &Arc<Producers>,
    rotation: &mut Rotation,
    credits: &mut Option<Credits>,
    shutdown: &CancellationToken,
) -> Option<(Vec<ClaimedJob>, Reservation)> {
    let stats = &p.run.stats;
    let mut rng = StdRng::from_entropy();
    let mut refusals = Refusals::default();
    // A target to claim from as a last resort (see `refusals`), next.
    let mut last_resort = None;
    loop {
        if credits.is_none() {
            *credits = tokio::select! {
                _ = shutdown.cancelled() => return None,
                taken = p.credits.take(p.config.batch_size) => Some(taken),
            };
        }
        if shutdown.is_cancelled() {
            return None;
        }
        let now = Instant::now();
        let (next, as_last_resort) = match last_resort.take() {
            Some(target) => (Next::Visit(target), true),
            None => (
                recovered_target(p).map_or_else(|| rotation.next(now), Next::Visit),
                false,
            ),
        };
        let target = match next {
            Next::Visit(target) => target,
            Next::WaitUntil(until) => {
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep_until(until.into()) => continue,
                }
            }
        };
        let Target {
            shard: shard_index,
            queue,
        } = &p.targets[target];
        let shard_index = *shard_index;
        // A limited queue's claim takes no more jobs than the permits free.
        let reserved = p.run.permits.reserve(queue, p.config.batch_size, now);
        let usable = p.run.health.usable(shard_index);
        // A claim on a suspect shard that still answers, where nothing else
        // could be claimed: one per process at a time.
        let last_resort_claim = reserved.is_some()
            && !usable
            && as_last_resort
            && p.run.health.with(shard_index, Health::take_last_resort);
        // Before the wake-up is taken: a suspect shard's wake-up waits for
        // it to answer again.
        let entered = if reserved.is_none() {
            Err(now + LIMIT_RECHECK)
        } else if usable || last_resort_claim {
            if p.wakeups.take(target) {
                p.gate.wake(target);
            }
            p.gate.try_enter(target, now).map_err(|why| {
                if last_resort_claim {
                    p.run.health.with(shard_index, Health::untake_last_resort);
                }
                p.config.reopens(why, now)
            })
        } else {
            Err(now + SUSPECT_RECHECK)
        };
        let entered = match entered {
            Ok(entered) => entered,
            Err(until) => {
                let slow = reserved.is_some()
                    && !usable
                    && !as_last_resort
                    && p.run.health.last_resort(shard_index);
                match refusals.refused(until, p.targets.len(), slow.then_some(target)) {
                    AfterRefusal::GoOn => {}
                    AfterRefusal::LastResort(target) => last_resort = Some(target),
                    AfterRefusal::WaitUntil(until) => {
                        tokio::select! {
                            _ = shutdown.cancelled() => return None,
                            _ = p.gate.wait(until) => {}
                            _ = p.wakeups.sleep_until(until) => {}
                        }
                    }
                }
                continue;
            }
        };
        refusals.entered();
        let reserved = reserved.expect("entered only with permits");
        // A queue with a rate: no more jobs than the starts its home shard
        // gives now (those the claim does not use go back).
        let starts = match reserved.per_start() {
            None => None,
            Some(per_start) => match take_starts(p, queue, reserved.count(), per_start).await {
                Ok(starts) => starts,
                Err(until) => {
                    drop(entered);
                    if last_resort_claim {
                        p.run.health.with(shard_index, Health::untake_last_resort);
                    }
                    match refusals.refused(until, p.targets.len(), None) {
                        AfterRefusal::GoOn => {}
                        AfterRefusal::LastResort(target) => last_resort = Some(target),
                        AfterRefusal::WaitUntil(until) => {
                            tokio::select! {
                                _ = shutdown.cancelled() => return None,
                                _ = tokio::time::sleep_until(until.into()) => {}
                            }
                        }
                    }
                    continue;
                }
            },
        };
        let asked = starts.map_or(reserved.count(), |n| n.min(reserved.count()));
        let shard = p.run.shards.get(shard_index);
        let mode = match entered.slots() {
            Some(slots) => DequeueMode::Gated { slots },
            None => DequeueMode::Ungated,
        };
        let started = Instant::now();
        let budget = p.run.health.budget(shard_index);
        let mut claim = spawn_claim(p, target, mode, asked);
        let result = match tokio::time::timeout(budget, &mut claim).await {
            Ok(result) => joined(result),
            Err(_) => {
                // No answer within the budget: the shard is skipped (it
                // was already, for a last-resort claim), the claim's reply
                // is handled when it comes, and this producer goes on.
                stats.record_claim_wait(started.elapsed());
                stats.record_detached(shard_index);
                if !last_resort_claim {
                    suspect(p, shard_index, shutdown);
                }
                let late = LateClaim {
                    claim,
                    entered,
                    permits: reserved,
                    starts,
                    credits: credits_for_late_reply(p, credits),
                    target,
                    started,
                    last_resort: last_resort_claim,
                };
                p.spawn(late_reply(p.clone(), late, shutdown.clone()));
                continue;
            }
        };
        let now = Instant::now();
        let took = now - started;
        stats.record_claim_wait(took);
        settle(
            p,
            target,
            &result,
            took,
            Reply::OnTime,
            last_resort_claim,
            starts,
        );
        let held_back = matches!(&result, Ok(claim) if claim.held_back());
        match result {
            Ok(claim) if !claim.jobs().is_empty() => {
                let jobs = claim.into_jobs();
                entered.claimed(jobs.len(), took);
                // Fewer jobs than asked: the target is caught up. Where the
                // shard's wake-ups are heard, its next ready job announces
                // itself, so nobody claims here again until then: claiming
                // again at once found a job or two per statement under a
                // steady offer, and those claims kept four servers' CPU busy
                // at a tenth of their peak (`bench scale --rate`).
                // Fewer for group limits: more may start soon, unannounced.
                if jobs.len() < asked as usize && !held_back && p.wakeups.listening(shard_index) {
                    entered.empty_for(now, &mut rng, p.config.idle_poll);
                }
                publish_slots(p, target, &entered);
                drop(entered);
                rotation.claimed(target);
                return Some((jobs, reserved));
            }
            Ok(Claim::Busy) => {
                entered.busy(now, &mut rng);
                publish_slots(p, target, &entered);
            }
            // Empty where the shard's wake-ups are heard: its next ready
            // job announces itself.
            Ok(Claim::Empty) if p.wakeups.listening(shard_index) => {
                entered.empty_for(now, &mut rng, p.config.idle_poll)
            }
            // Empty unheard, or held back by group limits with no job taken:
            // no wake-up comes when they allow more, so the short empty skip.
            Ok(_) => entered.empty(now, &mut rng),
            Err(err) => {
                if err.kind().may_have_run() {
                    // No answer from the server: the claim may still have run.
                    p.run.lost_claims.lost(shard_index);
                }
                if fails_the_shard(err.kind()) {
                    suspect(p, shard_index, shutdown);
                }
                let delay = rotation.failed(target, now, &mut rng);
                tracing::warn!(
                    shard = %shard.name,
                    %queue,
                    retry_in_ms = delay.as_millis() as u64,
                    error = %crate::error_chain::error_chain(&err),
                    "claim failed; skipping target"
                );
            }
        }
    }
}
