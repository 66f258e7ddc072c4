//! The worker process: producers claim batches into a bounded buffer, executor
//! slots run handlers, the completer writes outcomes back in batches.
//!
//! ```text
//! shards ─> producers ─> keyed/unkeyed queues ─> executor slots ─> completer ─> shards
//!           (rotate,      (bounded in total      (C slots, key    (batched per
//!            gated)        by worker.buffer_jobs)  hash → slot)     shard, fenced)
//! ```

mod children;
mod claim_task;
mod completer;
mod context;
mod context_events;
mod context_send;
mod credits;
mod executor;
mod full_recovery;
mod handler;
mod heartbeat;
mod late_reply;
mod leaser;
mod limit_leaser;
mod local_gate;
mod maintenance;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub mod metrics;
mod per_shard;
mod permits;
mod probe;
mod producer;
mod producers;
mod promoter;
mod rate_starts;
mod refusals;
mod rotation;
mod running;
mod scheduler;
mod set_aside;
mod settle;
mod shard_health;
mod slot_control;
mod slot_input;
mod step_log;
mod target;
mod unreachable;
mod wake_relay;
mod wakeup;
mod worker_run;

#[cfg(test)]
mod lease_telemetry_tests;

// Operator tooling, behind the `internal` feature (see `lib.rs`).
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use crate::heartbeat::{HEARTBEAT_INTERVAL, HEARTBEAT_TTL};
pub use crate::telemetry::{Stats, StatsSnapshot};
pub use children::{ChildError, ChildHandle, ChildResult};
pub use context::{JobContext, StepError};
pub use handler::{HandlerError, HandlerRegistry, HandlerResult, PermanentFailure, NOOP, SLEEP};

use crate::config::Config;
use crate::job::{ClaimedJob, Completion, Outcome};
use crate::prometheus::WorkerMetrics;
use crate::schedule::{Schedule, ScheduleError};
use crate::shards::ShardSet;
use crate::store::queues;
use completer::CompleterConfig;
use credits::BufferCredits;
use executor::{Executor, ExecutorConfig};
use leaser::LeaserConfig;
use local_gate::LocalGate;
use maintenance::MaintenanceConfig;
use producers::{Dispatch, ProducerConfig, Producers};
use rand::Rng;
use running::{LostClaims, RunningJobs};
use shard_health::ShardHealth;
use slot_control::SlotControl;
use slot_input::{SetAsideJobs, SlotInputs};
use std::sync::Arc;
use std::time::{Duration, Instant};
use target::targets;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use wakeup::{RelayBells, Wakeups};
use worker_run::WorkerRun;

/// How often `stop_when_empty` asks the shards whether work is left.
const EMPTY_CHECK_INTERVAL: Duration = Duration::from_millis(200);

/// A worker over a set of shards.
pub struct Worker {
    config: Config,
    shards: ShardSet,
    registry: HandlerRegistry,
    stop_when_empty: bool,
    stats: Arc<Stats>,
    /// Periodic jobs this worker enqueues (`config.schedules` and those added in code).
    schedules: Vec<Schedule>,
    /// The scheduler's local clock (set off only by tests).
    scheduler_clock: scheduler::LocalClock,
}

/// What a finished worker run did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerReport {
    /// Counters.
    pub stats: StatsSnapshot,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl WorkerReport {
    /// Jobs written back (succeeded or failed) per second.
    pub fn jobs_per_second(&self) -> f64 {
        self.stats.finished() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl Worker {
    /// A worker for the queues in `config.worker.queues`, with `registry`'s handlers.
    pub fn new(config: Config, shards: ShardSet, registry: HandlerRegistry) -> Self {
        let stats = Arc::new(Stats::for_queues(
            shards.len(),
            config.worker.queues.clone(),
        ));
        Worker {
            schedules: config.schedules.clone(),
            config,
            shards,
            registry,
            stop_when_empty: false,
            stats,
            scheduler_clock: scheduler::LocalClock::default(),
        }
    }

    /// Sets the scheduler's local clock `ahead` of the system clock (negative:
    /// behind), as on a host whose clock is off. For tests and the torture
    /// run: ticks are judged by the shards' clocks, so this changes only how
    /// long the scheduler sleeps.
    #[doc(hidden)]
    pub fn scheduler_clock_ahead(mut self, ahead: chrono::TimeDelta) -> Self {
        self.scheduler_clock = scheduler::LocalClock { ahead };
        self
    }

    /// Adds a periodic job to those of `config.schedules`: while the worker
    /// runs, it enqueues the schedule's ticks (each once across the fleet,
    /// whichever process wins it). Every process of a fleet should be given
    /// the same schedules.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::Duplicate`] when the worker has a schedule of that
    /// name; [`ScheduleError::Job`] when its jobs break `limits`.
    pub fn schedule(mut self, schedule: Schedule) -> Result<Worker, ScheduleError> {
        if self.schedules.iter().any(|s| s.name() == schedule.name()) {
            return Err(ScheduleError::Duplicate(schedule.name().to_string()));
        }
        schedule.validate(&self.config.limits)?;
        self.schedules.push(schedule);
        Ok(self)
    }

    /// Stop by itself once no shard has a queued or running job of its queues.
    pub fn stop_when_empty(mut self, yes: bool) -> Self {
        self.stop_when_empty = yes;
        self
    }

    /// Live counters, readable while the worker runs.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// This worker's metrics in Prometheus form, live while it runs: serve
    /// [`WorkerMetrics::encode`] from your HTTP server, or add them to your
    /// registry with [`WorkerMetrics::register`].
    pub fn metrics(&self) -> WorkerMetrics {
        let names = self.shards.all().iter().map(|s| s.name.clone()).collect();
        WorkerMetrics::new(self.stats.clone(), names)
    }

    /// Runs until `shutdown` is cancelled (or, with `stop_when_empty`, until no
    /// work is left). Then it stops claiming, lets running handlers finish
    /// within `worker.shutdown_grace`, gives claimed-but-unstarted jobs back to
    /// the queue at once, and writes every completion before returning.
    pub async fn run(self, shutdown: CancellationToken) -> WorkerReport {
        let started = Instant::now();
        let owner: Arc<str> = format!(
            "{}-{:08x}",
            std::process::id(),
            rand::thread_rng().gen::<u32>()
        )
        .into();
        let config = self.config;
        let shards = self.shards.len();
        let run = Arc::new(WorkerRun {
            lost_claims: LostClaims::new(self.shards.len()),
            shards: self.shards,
            owner,
            stats: self.stats,
            running: RunningJobs::default(),
            health: ShardHealth::new(shards, config.dequeue.claim_budget_max),
            permits: Arc::new(permits::Permits::new(
                &config.worker.queues,
                u32::try_from(config.worker.buffer_jobs * credits::HELD_PER_BUFFERED)
                    .unwrap_or(u32::MAX),
            )),
        });
        tracing::info!(owner = %run.owner, shards = run.shards.len(), "worker started");

        let claiming = shutdown.child_token();
        // Leases stay alive until every completion is written.
        let leasing = CancellationToken::new();
        let leaser = tokio::spawn(leaser::run(
            LeaserConfig::new(&config),
            run.clone(),
            leasing.clone(),
        ));
        // Permits are renewed until every completion is written, then given back.
        let permitting = CancellationToken::new();
        let limit_leaser = tokio::spawn(limit_leaser::run(
            run.permits.clone(),
            run.shards.clone(),
            run.owner.clone(),
            config.dequeue.batch_size,
            permitting.clone(),
        ));
        // Heartbeats go on until every completion is written, then say goodbye.
        let beating = CancellationToken::new();
        let heartbeat = tokio::spawn(heartbeat::run(
            heartbeat::HeartbeatConfig::new(&config),
            run.clone(),
            started,
            beating.clone(),
        ));
        let mut background = JoinSet::new();
        background.spawn(maintenance::run(
            MaintenanceConfig::new(&config),
            run.shards.clone(),
            run.stats.clone(),
            claiming.clone(),
        ));
        background.spawn(promoter::run(
            config.worker.maintenance_interval,
            run.shards.clone(),
            claiming.clone(),
        ));
        let relay_bells = Arc::new(RelayBells::new(run.shards.len()));
        background.spawn(wake_relay::run(
            config.worker.maintenance_interval,
            run.owner.clone(),
            run.shards.clone(),
            relay_bells.clone(),
            claiming.clone(),
        ));
        if !self.schedules.is_empty() {
            background.spawn(scheduler::run(
                self.schedules,
                run.shards.clone(),
                config.limits.default_max_attempts,
                self.scheduler_clock,
                claiming.clone(),
            ));
        }
        if self.stop_when_empty {
            background.spawn(stop_when_empty(
                run.shards.clone(),
                config.worker.queues.clone(),
                claiming.clone(),
            ));
        }
        let registry = Arc::new(self.registry);
        run_pipeline(&config, &run, registry, relay_bells, &claiming).await;
        claiming.cancel();
        // Upkeep statements are idempotent and each is atomic, so stopping them
        // mid-flight loses nothing; waiting could mean a connect timeout per
        // unreachable shard.
        leasing.cancel();
        leaser.abort();
        let _ = leaser.await;
        background.shutdown().await;
        permitting.cancel();
        let _ = limit_leaser.await;
        beating.cancel();
        let _ = heartbeat.await;
        let report = WorkerReport {
            stats: run.stats.snapshot(),
            elapsed: started.elapsed(),
        };
        tracing::info!(?report, "worker stopped");
        report
    }
}

/// Capacity of an executor slot's own queue (keyed jobs): its share of the
/// buffer, at most one batch, at least one job. So a hot key holds at most
/// this many buffered jobs; a producer dispatching more waits for the slot.
fn slot_capacity(buffer_jobs: usize, concurrency: usize, batch_size: u32) -> usize {
    (buffer_jobs / concurrency.max(1)).clamp(1, (batch_size as usize).max(1))
}

/// The pipeline: producers, executor slots and the completer, until
/// `claiming` is cancelled; then the shutdown: producers stop, slots finish
/// the job in hand (within the grace period), unstarted jobs are released,
/// and every outcome is written (within the grace period again).
///
/// Channels: the slots' own queues hold [`slot_capacity`] jobs each; the
/// unkeyed queue and the completions hold `worker.buffer_jobs`, which the
/// buffer credits guarantee they never exceed (see `credits`), so sends
/// there never wait. Only a producer dispatching to a full slot waits, and
/// only for that slot, which drains by itself; at shutdown it stops waiting
/// and hands back the jobs it could not dispatch.
async fn run_pipeline(
    config: &Config,
    run: &Arc<WorkerRun>,
    registry: Arc<HandlerRegistry>,
    relay_bells: Arc<RelayBells>,
    claiming: &CancellationToken,
) {
    let worker = &config.worker;
    let dequeue = &config.dequeue;
    let concurrency = worker.concurrency;
    let grace = worker.shutdown_grace;
    let bound = worker.buffer_jobs.max(1);
    let credits = BufferCredits::new(worker.buffer_jobs);
    let (completions_tx, completions_rx) = mpsc::channel::<Completion>(bound);
    let (unkeyed_tx, unkeyed_rx) = async_channel::bounded(bound);
    let executor = Arc::new(Executor {
        config: ExecutorConfig::new(config),
        run: run.clone(),
        registry,
    });
    let per_slot = slot_capacity(worker.buffer_jobs, concurrency, dequeue.batch_size);
    let mut keyed = Vec::with_capacity(concurrency);
    let mut slots = JoinSet::new();
    let set_aside = Arc::new(SetAsideJobs::new(concurrency, run.shards.len()));
    for slot in 0..concurrency {
        let (tx, rx) = mpsc::channel(per_slot);
        keyed.push(tx);
        let inputs = SlotInputs {
            slot,
            own: rx,
            unkeyed: unkeyed_rx.clone(),
            set_aside: set_aside.clone(),
        };
        slots.spawn(executor::run_slot(
            executor.clone(),
            inputs,
            completions_tx.clone(),
            claiming.clone(),
        ));
    }
    drop(executor);
    let abandon = CancellationToken::new();
    let completer = tokio::spawn(completer::run(
        CompleterConfig::new(config),
        run.clone(),
        credits.clone(),
        completions_rx,
        abandon.clone(),
    ));
    let targets = targets(run.shards.len(), &worker.queues);
    let gate_slots = match dequeue.mode {
        crate::config::DequeueMode::Gated { slots } => Some(SlotControl::new(
            slots,
            dequeue.adaptive_slots,
            dequeue.batch_size,
        )),
        crate::config::DequeueMode::Ungated => None,
    };
    let gate = LocalGate::new(
        targets.len(),
        gate_slots,
        dequeue.busy_backoff,
        dequeue.empty_backoff,
    )
    .with_wake_cooldown(dequeue.wake_cooldown);
    let wakeups = Arc::new(Wakeups::new(&targets, run.shards.len(), relay_bells));
    let mut listeners = JoinSet::new();
    for shard in run.shards.all() {
        listeners.spawn(wakeup::listen(
            shard.clone(),
            wakeups.clone(),
            claiming.clone(),
        ));
    }
    let producers = Arc::new(Producers::new(
        ProducerConfig::new(config),
        run.clone(),
        targets,
        gate,
        credits,
        Dispatch {
            keyed,
            unkeyed: unkeyed_tx,
            given_back: completions_tx.clone(),
        },
        wakeups,
    ));
    let mut running = JoinSet::new();
    for _ in 0..worker.producers {
        running.spawn(producer::run(producers.clone(), claiming.clone()));
    }
    // Jobs claimed but not started, released below.
    let mut unstarted = Vec::new();
    while let Some(joined) = running.join_next().await {
        if let Ok(undispatched) = joined {
            unstarted.extend(undispatched);
        }
    }
    // Claims past their budget hand their jobs on (or back) first.
    producers::finish_background(&producers, grace).await;
    // The last handle on the dispatch: the slots' inputs close.
    drop(producers);
    listeners.shutdown().await;

    // Slots finish the job in hand (within the grace period) and stop.
    let finished = tokio::time::timeout(grace, async {
        while let Some(Ok(inputs)) = slots.join_next().await {
            unstarted.extend(inputs.unstarted());
        }
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            grace_s = grace.as_secs_f64(),
            "handlers still running after the grace period; abandoning them (their jobs return when leases expire)"
        );
        slots.abort_all();
        while slots.join_next().await.is_some() {}
    }
    while let Ok(job) = unkeyed_rx.try_recv() {
        unstarted.push(job);
    }
    // Jobs of sick shards the slots set aside (kept apart from the slots,
    // so even an abandoned slot's are released).
    unstarted.extend(set_aside.drain());
    // Unstarted jobs go back through the completer (released, or cancelled
    // when that was asked), so other workers can take them at once.
    tracing::info!(jobs = unstarted.len(), "releasing unstarted jobs");
    release(run, &completions_tx, unstarted).await;
    drop(completions_tx);
    if tokio::time::timeout(grace, completer).await.is_err() {
        abandon.cancel();
    }
}

/// Hands unstarted jobs to the completer as released. The completions
/// channel has room for them: each still holds its buffer credit.
async fn release(run: &WorkerRun, completions: &mpsc::Sender<Completion>, jobs: Vec<ClaimedJob>) {
    run.stats.record_unbuffered(jobs.len());
    for job in jobs {
        let _ = completions
            .send(Completion::of(&job, Outcome::Released))
            .await;
    }
}

/// Cancels `claiming` once no shard has a queued or running job of
/// `queues`; a shard that does not answer counts as having some.
async fn stop_when_empty(shards: ShardSet, queues: Vec<String>, claiming: CancellationToken) {
    loop {
        tokio::select! {
            _ = claiming.cancelled() => return,
            _ = tokio::time::sleep(EMPTY_CHECK_INTERVAL) => {}
        }
        let mut pending = false;
        'look: for queue in &queues {
            for shard in shards.all() {
                if !matches!(queues::has_pending(shard, queue).await, Ok(false)) {
                    pending = true;
                    break 'look;
                }
            }
        }
        if !pending {
            tracing::info!("no queued or running job left; stopping");
            claiming.cancel();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_holds_its_share_of_the_buffer_at_most_a_batch_at_least_one() {
        assert_eq!(slot_capacity(1000, 4, 100), 100);
        assert_eq!(slot_capacity(1000, 100, 100), 10);
        assert_eq!(slot_capacity(10, 100, 100), 1);
        assert_eq!(slot_capacity(10, 0, 0), 1);
    }
}
