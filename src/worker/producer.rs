//! Producers: claim batches while rotating over the targets (shard × queue),
//! and hand the jobs to the executor slots. A producer claims only when the
//! process has room for a whole batch (it takes the batch's [`BufferCredits`]
//! first and keeps one per job claimed).

use super::credits::BufferCredits;
use super::local_gate::{LocalGate, Refused};
use super::rotation::{Next, Rotation};
use super::wakeup::Wakeups;
use super::Shared;
use crate::config::{Backoff, Config, DequeueMode};
use crate::job::ClaimedJob;
use crate::store::jobs::{self, Claim, ClaimParams};
use crate::store::ErrorKind;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

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
}

impl ProducerConfig {
    pub fn new(config: &Config) -> Self {
        ProducerConfig {
            batch_size: config.dequeue.batch_size,
            lease: config.worker.lease,
            full_wait: config.dequeue.busy_backoff.max,
            unhealthy: config.dequeue.unhealthy_backoff,
            idle_poll: config.dequeue.idle_poll,
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
    pub shared: Arc<Shared>,
    /// Every (shard index, queue) pair this worker serves.
    pub targets: Vec<(usize, String)>,
    /// Dequeue permits, busy backoff and empty skips per target.
    pub gate: LocalGate,
    pub credits: BufferCredits,
    pub dispatch: Dispatch,
    /// Targets announced ready by the shards' notifications.
    pub wakeups: Arc<Wakeups>,
    /// Claims made so far: numbers each claim (see [`ClaimedJob::claim`]).
    claims: AtomicU64,
}

impl Producers {
    pub fn new(
        config: ProducerConfig,
        shared: Arc<Shared>,
        targets: Vec<(usize, String)>,
        gate: LocalGate,
        credits: BufferCredits,
        dispatch: Dispatch,
        wakeups: Arc<Wakeups>,
    ) -> Self {
        Producers {
            config,
            shared,
            targets,
            gate,
            credits,
            dispatch,
            wakeups,
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
/// undispatched jobs are given back. The shared queue is bounded by the
/// buffer credits, so a send there never waits.
pub(crate) struct Dispatch {
    pub keyed: Vec<mpsc::Sender<ClaimedJob>>,
    pub shared: async_channel::Sender<ClaimedJob>,
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
                    match self.shared.try_send(job) {
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
    let p = &*producers;
    let mut rotation = p.rotation();
    loop {
        let credits = tokio::select! {
            _ = shutdown.cancelled() => return Vec::new(),
            credits = p.credits.take(p.config.batch_size) => credits,
        };
        // At shutdown `credits` drops unused and goes back.
        let Some(mut jobs) = claim_somewhere(p, &mut rotation, &shutdown).await else {
            return Vec::new();
        };
        credits.keep(jobs.len());
        let claim = p.next_claim();
        for job in &mut jobs {
            job.claim = claim;
            p.shared.running.hold(job);
        }
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
fn publish_slots(p: &Producers, target: usize, entered: &super::local_gate::Entered) {
    if let (Some(k), Some(t)) = (
        entered.slots_now(),
        p.shared.stats.metrics.targets.get(target),
    ) {
        t.slots
            .store(u64::from(k), std::sync::atomic::Ordering::Relaxed);
    }
}

/// Visits targets until one yields jobs; `None` at shutdown.
async fn claim_somewhere(
    p: &Producers,
    rotation: &mut Rotation,
    shutdown: &CancellationToken,
) -> Option<Vec<ClaimedJob>> {
    let stats = &p.shared.stats;
    let mut rng = StdRng::from_entropy();
    let mut refusals = Refusals::default();
    loop {
        if shutdown.is_cancelled() {
            return None;
        }
        let now = Instant::now();
        let target = match rotation.next(now) {
            Next::Visit(target) => target,
            Next::WaitUntil(until) => {
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep_until(until.into()) => continue,
                }
            }
        };
        if p.wakeups.take(target) {
            p.gate.wake(target);
        }
        let entered = match p.gate.try_enter(target, now) {
            Ok(entered) => entered,
            Err(why) => {
                let until = p.config.reopens(why, now);
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
        let (shard_index, queue) = &p.targets[target];
        let shard = p.shared.shards.get(*shard_index);
        let params = ClaimParams {
            queue,
            limit: p.config.batch_size,
            owner: &p.shared.owner,
            lease: p.config.lease,
            mode: match entered.slots() {
                Some(slots) => DequeueMode::Gated { slots },
                None => DequeueMode::Ungated,
            },
        };
        let started = Instant::now();
        let result = jobs::claim(shard, params).await;
        let now = Instant::now();
        stats.record_claim(*shard_index, target, &result, now - started);
        match result {
            Ok(Claim::Jobs(jobs)) => {
                entered.claimed(jobs.len(), now - started);
                // Fewer jobs than asked: the target is caught up. Where the
                // shard's wake-ups are heard, its next ready job announces
                // itself, so nobody claims here again until then: claiming
                // again at once found a job or two per statement under a
                // steady offer, and those claims kept four servers' CPU busy
                // at a tenth of their peak (`bench scale --rate`).
                if jobs.len() < p.config.batch_size as usize && p.wakeups.listening(*shard_index) {
                    entered.empty_for(now, &mut rng, p.config.idle_poll);
                }
                publish_slots(p, target, &entered);
                drop(entered);
                rotation.claimed(target);
                return Some(jobs);
            }
            Ok(Claim::Busy) => {
                entered.busy(now, &mut rng);
                publish_slots(p, target, &entered);
            }
            Ok(Claim::Empty) if p.wakeups.listening(*shard_index) => {
                entered.empty_for(now, &mut rng, p.config.idle_poll)
            }
            Ok(Claim::Empty) => entered.empty(now, &mut rng),
            Err(err) => {
                if err.kind() == ErrorKind::NoAnswer {
                    // No answer from the server: the claim may still have run.
                    p.shared.lost_claims.lost(*shard_index);
                }
                let delay = rotation.failed(target, now, &mut rng);
                tracing::warn!(
                    shard = %shard.name,
                    retry_in_ms = delay.as_millis() as u64,
                    error = %crate::error_chain(&err),
                    "claim failed; skipping shard"
                );
            }
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
        let (shared, any) = async_channel::bounded(8);
        let dispatch = Dispatch {
            keyed: vec![keyed],
            shared,
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
