//! What the producers of one process share: their settings, the targets,
//! the gate, the buffer credits, where claimed jobs go ([`Dispatch`]) and
//! the tasks they leave running in the background (late claim replies,
//! probes, starts given back).

use super::credits::BufferCredits;
use super::local_gate::{LocalGate, Refused};
use super::rotation::Rotation;
use super::target::Target;
use super::wakeup::Wakeups;
use super::worker_run::WorkerRun;
use crate::config::{Backoff, Config};
use crate::job::{ClaimedJob, Completion};
use rand::Rng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
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
    /// Ceiling of a shard's claim budget (`dequeue.claim_budget_max_ms`).
    pub claim_budget_max: Duration,
    /// Producers of the process (`worker.producers`).
    pub producers: usize,
    /// Jobs the process holds at most (`worker.buffer_jobs`).
    pub buffer_jobs: usize,
}

impl ProducerConfig {
    pub(crate) fn new(config: &Config) -> Self {
        ProducerConfig {
            batch_size: config.dequeue.batch_size,
            lease: config.worker.lease,
            full_wait: config.dequeue.busy_backoff.max,
            unhealthy: config.dequeue.unhealthy_backoff,
            idle_poll: config.dequeue.idle_poll,
            claim_budget_max: config.dequeue.claim_budget_max,
            producers: config.worker.producers,
            buffer_jobs: config.worker.buffer_jobs,
        }
    }

    /// Whether the buffer has room for a batch beside a late claim of every
    /// producer (a producer leaves one claim past its budget to a shard
    /// that falls sick: the shard is skipped from then on).
    pub(crate) fn room_beside_late_claims(&self) -> bool {
        self.buffer_jobs >= (self.producers + 1) * self.batch_size as usize
    }

    /// When a target the gate refused `now` for `why` may be tried again.
    pub(crate) fn reopens(&self, why: Refused, now: Instant) -> Instant {
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
    /// Late claim replies that may wait for room beyond the buffer credits
    /// at once: one per producer, so that the jobs held beyond the buffer
    /// stay within a batch per producer (`late_reply`).
    pub late_waiting: Semaphore,
}

impl Producers {
    pub(crate) fn new(
        config: ProducerConfig,
        run: Arc<WorkerRun>,
        targets: Vec<Target>,
        gate: LocalGate,
        credits: BufferCredits,
        dispatch: Dispatch,
        wakeups: Arc<Wakeups>,
    ) -> Self {
        Producers {
            late_waiting: Semaphore::new(config.producers),
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
    pub(crate) fn next_claim(&self) -> u64 {
        self.claims.fetch_add(1, Ordering::Relaxed)
    }

    /// A rotation from a random target, so producers spread out.
    pub(crate) fn rotation(&self) -> Rotation {
        let start = rand::thread_rng().gen_range(0..self.targets.len().max(1));
        Rotation::new(self.targets.len(), start, self.config.unhealthy)
    }

    /// Runs `task` on its own, awaited at shutdown.
    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
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
    /// The completer's input, for jobs given back unrun (a late claim's
    /// that found no room): released there, like every outcome.
    pub given_back: mpsc::Sender<Completion>,
}

impl Dispatch {
    /// Dispatches `jobs` in order; the ones not dispatched when `shutdown`
    /// came (or the executors were gone) come back, to be released.
    pub(crate) async fn send_all(
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
            claim_budget_max: Duration::from_millis(250),
            producers: 1,
            buffer_jobs: 20,
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

    fn job(key: Option<&str>) -> ClaimedJob {
        ClaimedJob::for_test(1, 0, key)
    }

    #[tokio::test(start_paused = true)]
    async fn dispatch_to_a_full_slot_waits_and_shutdown_gives_back_the_rest() {
        let (keyed, mut own) = mpsc::channel(1);
        let (unkeyed, any) = async_channel::bounded(8);
        let dispatch = Dispatch {
            keyed: vec![keyed],
            unkeyed,
            given_back: mpsc::channel(1).0,
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
