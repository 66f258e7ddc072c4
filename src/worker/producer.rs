//! Producers: claim batches while rotating over the targets (shard × queue),
//! and hand the jobs to the executor slots. A producer claims only when the
//! process has room for a whole batch (it takes the batch's [`BufferCredits`]
//! first and keeps one per job claimed).
//!
//! A producer waits on one claim no longer than its shard's budget
//! ([`super::shard_health`]); a claim past it is left to a task of its own
//! ([`late_reply`]), the shard is skipped by every producer until its probe
//! ([`probe`]) answers in time, and the producer moves on at once with the
//! same credits.

use super::credits::BufferCredits;
use super::local_gate::{Entered, LocalGate, Refused};
use super::permits::Reservation;
use super::rotation::{jitter, Next, Rotation};
use super::shard_health::PROBE_INTERVAL;
use super::target::Target;
use super::wakeup::Wakeups;
use super::worker_run::WorkerRun;
use crate::config::{Backoff, Config, DequeueMode};
use crate::job::{ClaimedJob, Completion, Outcome};
use crate::shards::ShardError;
use crate::store::jobs::{self, Claim, ClaimParams, CompleteMany};
use crate::store::{self, ErrorKind};
use futures_util::FutureExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

/// How often a producer whose every target is skipped (their shards
/// suspect) looks again: half the probe interval, so a shard a probe found
/// well again is used within that.
const SUSPECT_RECHECK: Duration = Duration::from_millis(100);

/// How soon a target whose queue had no permit free is visited again: the
/// permit leaser asks for more meanwhile (at most every 50 ms), and jobs
/// finishing free some.
const LIMIT_RECHECK: Duration = Duration::from_millis(20);

/// How soon a target whose queue's rate gave no start is visited again:
/// after half a start's time, within these bounds (at high rates a take
/// waits for half the rate's 50 ms burst, so sooner finds nothing).
const RATE_RECHECK: Backoff = Backoff {
    min: Duration::from_millis(10),
    max: Duration::from_millis(500),
};

/// The producers' settings, from [`Config`].
#[derive(Debug, Clone)]
pub(crate) struct ProducerConfig {
    /// Jobs per claim statement (`dequeue.batch_size`).
    pub batch_size: u32,
    /// Lease of a claimed job (`worker.lease`).
    pub lease: Duration,
    /// Longest wait for a target whose gate permits are all taken: a permit
    /// comes back within a claim statement, so this only bounds a missed
    /// wake-up (`dequeue.busy_backoff.max`).
    pub full_wait: Duration,
    /// Skip time of a failing target (`dequeue.unhealthy_backoff`).
    pub unhealthy: Backoff,
    /// Skip time of an empty target on a shard whose wake-ups are heard
    /// (`dequeue.idle_poll_ms`).
    pub idle_poll: Backoff,
    /// Retry delays written with a release (`worker.retry_backoff`).
    pub retry: Backoff,
    /// Ceiling of a shard's claim budget (`dequeue.claim_budget_max_ms`).
    pub claim_budget_max: Duration,
}

impl ProducerConfig {
    pub fn new(config: &Config) -> Self {
        ProducerConfig {
            batch_size: config.dequeue.batch_size,
            lease: config.worker.lease,
            full_wait: config.dequeue.busy_backoff.max,
            unhealthy: config.dequeue.unhealthy_backoff,
            idle_poll: config.dequeue.idle_poll,
            retry: config.worker.retry_backoff,
            claim_budget_max: config.dequeue.claim_budget_max,
        }
    }

    /// When a target the gate refused `now` for `why` may be tried again.
    fn reopens(&self, why: Refused, now: Instant) -> Instant {
        match why {
            Refused::Full => now + self.full_wait,
            Refused::SkipUntil(until) => until,
        }
    }
}

/// What the producers of one process share.
pub(crate) struct Producers {
    pub config: ProducerConfig,
    pub run: Arc<WorkerRun>,
    /// Every (shard index, queue) pair this worker serves.
    pub targets: Vec<Target>,
    /// Dequeue permits, busy backoff and empty skips per target.
    pub gate: LocalGate,
    pub credits: BufferCredits,
    pub dispatch: Dispatch,
    /// Targets announced ready by the shards' notifications.
    pub wakeups: Arc<Wakeups>,
    /// Claims past their budget and probes of suspect shards, each a task
    /// of its own; awaited at shutdown ([`finish_background`]).
    background: Mutex<JoinSet<()>>,
    /// Claims made so far: numbers each claim (see [`ClaimedJob::claim`]).
    claims: AtomicU64,
}

impl Producers {
    pub fn new(
        config: ProducerConfig,
        run: Arc<WorkerRun>,
        targets: Vec<Target>,
        gate: LocalGate,
        credits: BufferCredits,
        dispatch: Dispatch,
        wakeups: Arc<Wakeups>,
    ) -> Self {
        Producers {
            config,
            run,
            targets,
            gate,
            credits,
            dispatch,
            wakeups,
            background: Mutex::new(JoinSet::new()),
            claims: AtomicU64::new(0),
        }
    }

    /// A new claim's number.
    fn next_claim(&self) -> u64 {
        self.claims.fetch_add(1, Ordering::Relaxed)
    }

    /// A rotation from a random target, so producers spread out.
    fn rotation(&self) -> Rotation {
        let start = rand::thread_rng().gen_range(0..self.targets.len().max(1));
        Rotation::new(self.targets.len(), start, self.config.unhealthy)
    }

    /// Runs `task` on its own, awaited at shutdown.
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut background = self.background.lock().expect("background tasks");
        while background.try_join_next().is_some() {}
        background.spawn(task);
    }
}

/// After the producers stopped: waits for the claims past their budget
/// (their replies, or their deadlines) and the probes, at most `grace`;
/// then abandons the rest (a claim abandoned so may leave jobs running
/// under this process, which lease recovery returns).
pub(crate) async fn finish_background(producers: &Producers, grace: Duration) {
    let mut background =
        std::mem::take(&mut *producers.background.lock().expect("background tasks"));
    if tokio::time::timeout(grace, async {
        while background.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tracing::warn!(
            grace_s = grace.as_secs_f64(),
            "claims still unanswered after the grace period; abandoning them (their jobs return when leases expire)"
        );
        background.shutdown().await;
    }
}

/// Where claimed jobs go: keyed jobs to the slot their queue and key hash to
/// (`executor::slot_for`), the rest to a queue that every slot serves.
///
/// Both are bounded. A slot's own queue holds a few jobs (see
/// `run_pipeline`), so a hot key cannot hold the whole buffer: a producer
/// dispatching to a full slot waits until that slot takes its next job.
/// That cannot deadlock: the slot drains by itself (it runs the job in hand
/// and hands its outcome to the completions channel, whose sends never wait:
/// see [`super::credits`]), and at shutdown the wait ends at once and the
/// undispatched jobs are given back. The unkeyed queue is bounded by the
/// buffer credits, so a send there never waits.
pub(crate) struct Dispatch {
    pub keyed: Vec<mpsc::Sender<ClaimedJob>>,
    pub unkeyed: async_channel::Sender<ClaimedJob>,
}

impl Dispatch {
    /// Dispatches `jobs` in order; the ones not dispatched when `shutdown`
    /// came (or the executors were gone) come back, to be released.
    async fn send_all(
        &self,
        jobs: Vec<ClaimedJob>,
        shutdown: &CancellationToken,
    ) -> Vec<ClaimedJob> {
        let mut jobs = jobs.into_iter();
        while let Some(job) = jobs.next() {
            if let Err(job) = self.send(job, shutdown).await {
                return std::iter::once(job).chain(jobs).collect();
            }
        }
        Vec::new()
    }

    async fn send(&self, job: ClaimedJob, shutdown: &CancellationToken) -> Result<(), ClaimedJob> {
        match &job.ordering_key {
            Some(key) => {
                let slot = super::executor::slot_for(&job.queue, key, self.keyed.len());
                // Biased: a job that finds room goes to its slot even at
                // shutdown (it is released from there, unstarted).
                let reserved = tokio::select! {
                    biased;
                    reserved = self.keyed[slot].reserve() => reserved,
                    _ = shutdown.cancelled() => return Err(job),
                };
                match reserved {
                    Ok(permit) => {
                        permit.send(job);
                        Ok(())
                    }
                    Err(_) => Err(job),
                }
            }
            None => {
                let mut job = job;
                loop {
                    match self.unkeyed.try_send(job) {
                        Ok(()) => return Ok(()),
                        Err(async_channel::TrySendError::Closed(back)) => return Err(back),
                        // Not while the credits hold (see `credits`); waiting
                        // keeps it correct if they ever did not.
                        Err(async_channel::TrySendError::Full(back)) => {
                            job = back;
                            tokio::select! {
                                _ = shutdown.cancelled() => return Err(job),
                                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One producer's loop; returns at shutdown, with the jobs it claimed but
/// could not dispatch any more (to be released).
pub(crate) async fn run(producers: Arc<Producers>, shutdown: CancellationToken) -> Vec<ClaimedJob> {
    let p = &producers;
    let mut rotation = p.rotation();
    loop {
        let credits = tokio::select! {
            _ = shutdown.cancelled() => return Vec::new(),
            credits = p.credits.take(p.config.batch_size) => credits,
        };
        // At shutdown `credits` drops unused and goes back.
        let Some((mut jobs, mut permits)) = claim_somewhere(p, &mut rotation, &shutdown).await
        else {
            return Vec::new();
        };
        credits.keep(jobs.len());
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

/// Gate refusals in a row: once every target was refused, the producer
/// waits until the earliest of them reopens.
#[derive(Debug, Default)]
struct Refusals {
    count: usize,
    reopens: Option<Instant>,
}

impl Refusals {
    /// A target was refused until `until`; of `targets` targets. Returns
    /// when to wait until once all were refused in a row (and starts over).
    fn refused(&mut self, until: Instant, targets: usize) -> Option<Instant> {
        self.count += 1;
        let earliest = self.reopens.map_or(until, |r| r.min(until));
        self.reopens = Some(earliest);
        if self.count < targets {
            return None;
        }
        *self = Refusals::default();
        Some(earliest)
    }

    /// A target let the producer in.
    fn entered(&mut self) {
        *self = Refusals::default();
    }
}

/// Shows the K of `target` in the worker's metrics.
fn publish_slots(p: &Producers, target: usize, entered: &Entered) {
    if let Some(k) = entered.slots_now() {
        p.run.stats.record_slots(target, k);
    }
}

/// Whether a claim's failure is its shard's (the server or the way to it),
/// not its target's: then every producer skips the shard until its probe
/// answers. A lock timeout or a cancelled statement is about one queue's
/// rows; a data error about one statement.
fn fails_the_shard(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::NoAnswer | ErrorKind::Unreachable | ErrorKind::Other
    )
}

/// Marks shard `shard` suspect for the whole process; the producer that
/// made it so starts its one probe.
fn suspect(p: &Arc<Producers>, shard: usize, shutdown: &CancellationToken) {
    if p.run.health.with(shard, |h| h.suspect(Instant::now())) {
        tracing::warn!(
            shard = %p.run.shards.get(shard).name,
            budget_ms = p.run.health.budget(shard).as_millis() as u64,
            "shard did not answer in time; every producer skips it until a probe answers"
        );
        p.spawn(probe(p.clone(), shard, shutdown.clone()));
    }
}

/// A claim of target `target` in a task of its own, so that a producer can
/// stop waiting for it without dropping it.
fn spawn_claim(
    p: &Arc<Producers>,
    target: usize,
    mode: DequeueMode,
    limit: u32,
) -> JoinHandle<Result<Claim, ShardError>> {
    let p = p.clone();
    tokio::spawn(async move {
        let Target {
            shard: shard_index,
            queue,
        } = &p.targets[target];
        let params = ClaimParams {
            queue,
            limit,
            owner: &p.run.owner,
            lease: p.config.lease,
            mode,
        };
        jobs::claim(p.run.shards.get(*shard_index), params).await
    })
}

/// The value of a finished task; its panic goes on in the caller.
fn joined<T>(result: Result<T, tokio::task::JoinError>) -> T {
    result.unwrap_or_else(|err| std::panic::resume_unwind(err.into_panic()))
}

/// A claim's result with a held-back claim as a plain one, and whether it
/// was held back.
fn unheld(result: Result<Claim, ShardError>) -> (Result<Claim, ShardError>, bool) {
    match result {
        Ok(claim) => {
            let (claim, held_back) = claim.unheld();
            (Ok(claim), held_back)
        }
        Err(err) => (Err(err), false),
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

/// Visits targets until one yields jobs, with the permits reserved for
/// them (their queue's, when limited); `None` at shutdown.
async fn claim_somewhere(
    p: &Arc<Producers>,
    rotation: &mut Rotation,
    shutdown: &CancellationToken,
) -> Option<(Vec<ClaimedJob>, Reservation)> {
    let stats = &p.run.stats;
    let mut rng = StdRng::from_entropy();
    let mut refusals = Refusals::default();
    loop {
        if shutdown.is_cancelled() {
            return None;
        }
        let now = Instant::now();
        let next = recovered_target(p).map_or_else(|| rotation.next(now), Next::Visit);
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
        // Before the wake-up is taken: a suspect shard's wake-up waits for
        // it to answer again.
        let entered = if reserved.is_none() {
            Err(now + LIMIT_RECHECK)
        } else if p.run.health.usable(shard_index) {
            if p.wakeups.take(target) {
                p.gate.wake(target);
            }
            p.gate
                .try_enter(target, now)
                .map_err(|why| p.config.reopens(why, now))
        } else {
            Err(now + SUSPECT_RECHECK)
        };
        let entered = match entered {
            Ok(entered) => entered,
            Err(until) => {
                if let Some(until) = refusals.refused(until, p.targets.len()) {
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = p.gate.wait(until) => {}
                        _ = p.wakeups.sleep_until(until) => {}
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
                    if let Some(until) = refusals.refused(until, p.targets.len()) {
                        tokio::select! {
                            _ = shutdown.cancelled() => return None,
                            _ = tokio::time::sleep_until(until.into()) => {}
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
        let (result, held_back) = match tokio::time::timeout(budget, &mut claim).await {
            Ok(result) => unheld(joined(result)),
            Err(_) => {
                // No answer within the budget: the shard is skipped, the
                // claim's reply is handled when it comes, and this producer
                // goes on with its credits.
                stats.record_claim_wait(started.elapsed());
                stats.record_detached(shard_index);
                suspect(p, shard_index, shutdown);
                p.spawn(late_reply(
                    p.clone(),
                    claim,
                    (entered, reserved, starts),
                    target,
                    started,
                    shutdown.clone(),
                ));
                continue;
            }
        };
        let now = Instant::now();
        let took = now - started;
        stats.record_claim_wait(took);
        stats.record_claim(shard_index, target, &result, took);
        if result.is_ok() {
            p.run.health.with(shard_index, |h| h.answered(took));
        }
        if let Some(starts) = starts {
            let used = match &result {
                Ok(Claim::Jobs(jobs)) => jobs.len() as u32,
                _ => 0,
            };
            give_back_starts(p, queue, starts.saturating_sub(used));
        }
        match result {
            Ok(Claim::Jobs(jobs)) => {
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
            // Held back by group limits: no wake-up comes when they allow
            // more, so the short empty skip even while listening.
            Ok(Claim::Empty) if !held_back && p.wakeups.listening(shard_index) => {
                entered.empty_for(now, &mut rng, p.config.idle_poll)
            }
            Ok(Claim::Empty) => entered.empty(now, &mut rng),
            Ok(Claim::HeldBack(_)) => unreachable!("unheld() made it Jobs or Empty"),
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

/// Up to `want` starts of rate-limited `queue` (one start per `per_start`)
/// from the limits' home shard: `Ok(None)` when the queue has no rate any
/// more; `Err(until)` when none is free (until about one comes back), or
/// the home shard is skipped as suspect or does not answer within its
/// budget.
async fn take_starts(
    p: &Producers,
    queue: &str,
    want: u32,
    per_start: Duration,
) -> Result<Option<u32>, Instant> {
    // A home shard the producers skip is not waited on for each claim.
    if !p.run.health.usable(0) {
        return Err(Instant::now() + SUSPECT_RECHECK);
    }
    let home = p.run.shards.get(0).clone();
    let want = i32::try_from(want).unwrap_or(i32::MAX);
    let budget = p.run.health.budget(0);
    let mut take = {
        let (home, queue) = (home.clone(), queue.to_string());
        tokio::spawn(async move { store::limits::take_starts(&home, &queue, want).await })
    };
    let taken = match tokio::time::timeout(budget, &mut take).await {
        Ok(joined_take) => joined(joined_take),
        Err(_) => {
            // Past its budget: the starts it takes, when it answers, go
            // back (else they would be lost to the rate).
            let queue = queue.to_string();
            p.spawn(async move {
                if let Ok(Ok(Some(n))) = take.await {
                    if n > 0 {
                        let _ = store::limits::take_starts(&home, &queue, -n).await;
                    }
                }
            });
            return Err(Instant::now() + SUSPECT_RECHECK);
        }
    };
    let now = Instant::now();
    match taken {
        Ok(None) => Ok(None),
        Ok(Some(n)) if n > 0 => Ok(Some(u32::try_from(n).unwrap_or(0))),
        Ok(Some(_)) => Err(now + (per_start / 2).clamp(RATE_RECHECK.min, RATE_RECHECK.max)),
        Err(err) => {
            tracing::warn!(
                shard = %home.name,
                %queue,
                error = %crate::error_chain::error_chain(&err),
                "cannot take starts of a rate-limited queue from the limits' home shard"
            );
            Err(now + SUSPECT_RECHECK)
        }
    }
}

/// Gives `n` unused starts of `queue` back to its rate, in the background.
fn give_back_starts(p: &Producers, queue: &str, n: u32) {
    if n == 0 {
        return;
    }
    let home = p.run.shards.get(0).clone();
    let queue = queue.to_string();
    let n = -i32::try_from(n).unwrap_or(i32::MAX);
    p.spawn(async move {
        let _ = store::limits::take_starts(&home, &queue, n).await;
    });
}

/// The reply of a claim that ran out of its budget, whenever it comes
/// (within the statement deadline): its jobs run when the process has room
/// for them now, and go back to the queue otherwise (fenced release); a
/// claim that got no answer at all is noted as lost, so that the leaser
/// gives back what it may have left this process owning. The gate permit
/// (`entered`) stays taken until then.
async fn late_reply(
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

/// The one probe of suspect shard `shard`: every [`PROBE_INTERVAL`], one
/// trivial statement with a deadline of its own, until an answer comes
/// within the shard's budget (or shutdown).
async fn probe(p: Arc<Producers>, shard: usize, shutdown: CancellationToken) {
    let mut rng = StdRng::from_entropy();
    let target = p.run.shards.get(shard);
    loop {
        let pause = jitter(&mut rng, PROBE_INTERVAL.min, PROBE_INTERVAL.max);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        let started = Instant::now();
        let answer = tokio::time::timeout(p.run.health.probe_deadline(), jobs::probe(target)).await;
        let took = matches!(answer, Ok(Ok(()))).then(|| started.elapsed());
        if p.run.health.probed(shard, took) {
            tracing::info!(
                shard = %target.name,
                answered_ms = took.unwrap_or_default().as_millis() as u64,
                "shard answers again; producers use it"
            );
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ProducerConfig {
        ProducerConfig {
            batch_size: 10,
            lease: Duration::from_secs(30),
            full_wait: Duration::from_millis(16),
            unhealthy: Backoff {
                min: Duration::from_millis(100),
                max: Duration::from_millis(1000),
            },
            idle_poll: Backoff {
                min: Duration::from_millis(1500),
                max: Duration::from_millis(3000),
            },
            retry: Backoff {
                min: Duration::from_millis(100),
                max: Duration::from_millis(1000),
            },
            claim_budget_max: Duration::from_millis(250),
        }
    }

    #[test]
    fn a_full_target_reopens_within_the_busy_cap_a_skipped_one_when_its_skip_ends() {
        let now = Instant::now();
        let later = now + Duration::from_secs(3);
        assert_eq!(
            config().reopens(Refused::Full, now),
            now + Duration::from_millis(16)
        );
        assert_eq!(config().reopens(Refused::SkipUntil(later), now), later);
    }

    #[test]
    fn waits_only_once_every_target_was_refused_until_the_earliest_reopens() {
        let now = Instant::now();
        let at = |ms| now + Duration::from_millis(ms);
        let mut r = Refusals::default();
        assert_eq!(r.refused(at(30), 3), None);
        assert_eq!(r.refused(at(10), 3), None);
        assert_eq!(r.refused(at(20), 3), Some(at(10)));
        // Starts over after a wait.
        assert_eq!(r.refused(at(50), 3), None);
        // An entered target breaks the streak.
        r.entered();
        assert_eq!(r.refused(at(40), 3), None);
        assert_eq!(r.refused(at(60), 3), None);
        assert_eq!(r.refused(at(70), 3), Some(at(40)));
    }

    fn job(key: Option<&str>) -> ClaimedJob {
        ClaimedJob {
            id: crate::job::JobId {
                shard_key: 0,
                id: 1,
            },
            shard: 0,
            queue: "q".into(),
            handler: "noop".into(),
            ordering_key: key.map(Into::into),
            payload: serde_json::Value::Null,
            attempt: 1,
            fence: 1,
            claim: 0,
            created_at: std::time::SystemTime::now(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn dispatch_to_a_full_slot_waits_and_shutdown_gives_back_the_rest() {
        let (keyed, mut own) = mpsc::channel(1);
        let (unkeyed, any) = async_channel::bounded(8);
        let dispatch = Dispatch {
            keyed: vec![keyed],
            unkeyed,
        };
        let shutdown = CancellationToken::new();
        let jobs = vec![job(Some("k")), job(Some("k")), job(None), job(Some("k"))];
        let sending = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { dispatch.send_all(jobs, &shutdown).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The slot holds one; the second waits for room.
        assert!(!sending.is_finished());
        assert!(own.recv().await.is_some());
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The second went in and the unkeyed one too; the fourth waits.
        assert_eq!(any.len(), 1);
        assert!(!sending.is_finished());
        shutdown.cancel();
        let left = sending.await.unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].ordering_key.as_deref(), Some("k"));
    }
}
