//! The worker process: producers claim batches into a bounded buffer, executor
//! slots run handlers, the completer writes outcomes back in batches.
//!
//! ```text
//! shards ─> producers ─> keyed/shared queues ─> executor slots ─> completer ─> shards
//!           (rotate,      (bounded in total      (C slots, key    (batched per
//!            gated)        by worker.buffer_jobs)  hash → slot)     shard, fenced)
//! ```

mod completer;
mod context;
mod executor;
mod handler;
mod leaser;
mod local_gate;
mod maintenance;
pub mod metrics;
mod producer;
pub mod rotation;
mod serial;
mod stats;

pub use context::{JobContext, StepError};
pub use handler::{HandlerError, HandlerRegistry, HandlerResult, NOOP, SLEEP};
pub use stats::{Stats, StatsSnapshot};

use crate::config::Config;
use crate::shards::ShardSet;
use local_gate::LocalGate;
use rand::Rng;
use rotation::Rotation;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How often `stop_when_empty` asks the shards whether work is left.
const EMPTY_CHECK_INTERVAL: Duration = Duration::from_millis(200);

/// State shared by the roles of one worker.
pub(crate) struct Pipeline {
    pub config: Config,
    pub shards: ShardSet,
    pub registry: Arc<HandlerRegistry>,
    /// Every (shard index, queue) pair this worker serves.
    pub targets: Vec<(usize, String)>,
    /// Unique per worker run; written on claimed rows; fences completions.
    pub owner: Arc<str>,
    /// Every job this process holds (claimed, until its outcome is written),
    /// with the shard it is on and its cancellation token: the leaser asks
    /// the shards about exactly these, and a cancelled one that has not
    /// started never does.
    pub held: Mutex<HashMap<crate::job::JobId, Held>>,
    /// Claims made so far: numbers each claim (see [`crate::job::ClaimedJob::claim`]).
    pub claims: std::sync::atomic::AtomicU64,
    /// Per shard: when a claim there last failed without the server's
    /// answer (a deadline, a cut connection), so the claim may have run
    /// anyway and left this process owning jobs it never received.
    pub lost_claim: Vec<Mutex<Option<std::time::Instant>>>,
    /// Room for claimed-but-unfinished jobs (bounds memory).
    pub room: Arc<Semaphore>,
    /// The dequeue slots and busy backoff shared by this process's producers.
    pub gate: LocalGate,
    pub stats: Arc<Stats>,
}

/// A job held by this process.
pub(crate) struct Held {
    pub shard: usize,
    pub fence: i64,
    pub cancel: CancellationToken,
}

/// A worker over a set of shards.
pub struct Worker {
    config: Config,
    shards: ShardSet,
    registry: HandlerRegistry,
    serial: bool,
    stop_when_empty: bool,
    stats: Arc<Stats>,
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
        let stats = Arc::new(Stats {
            metrics: metrics::Metrics::new(shards.len()),
            ..Stats::default()
        });
        Worker {
            config,
            shards,
            registry,
            serial: false,
            stop_when_empty: false,
            stats,
        }
    }

    /// Use the serial one-job-at-a-time baseline instead of the pipeline.
    pub fn serial(mut self, serial: bool) -> Self {
        self.serial = serial;
        self
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
        let targets: Vec<(usize, String)> = (0..self.shards.len())
            .flat_map(|s| {
                self.config
                    .worker
                    .queues
                    .iter()
                    .map(move |q| (s, q.clone()))
            })
            .collect();
        let slots = match self.config.dequeue.mode {
            crate::config::DequeueMode::Gated { slots } => Some(slots),
            crate::config::DequeueMode::Ungated => None,
        };
        let dequeue = &self.config.dequeue;
        let gate = LocalGate::new(
            targets.len(),
            slots,
            dequeue.busy_backoff,
            dequeue.empty_backoff,
        );
        let shard_count = self.shards.len();
        let pipeline = Arc::new(Pipeline {
            room: Arc::new(Semaphore::new(self.config.worker.buffer_jobs)),
            gate,
            config: self.config,
            shards: self.shards,
            registry: Arc::new(self.registry),
            targets,
            owner,
            held: Mutex::new(HashMap::new()),
            claims: std::sync::atomic::AtomicU64::new(0),
            lost_claim: (0..shard_count).map(|_| Mutex::new(None)).collect(),
            stats: self.stats.clone(),
        });
        tracing::info!(owner = %pipeline.owner, shards = pipeline.shards.len(), serial = self.serial, "worker started");

        let claiming = shutdown.child_token();
        // Leases stay alive until every completion is written.
        let leasing = CancellationToken::new();
        let leaser = tokio::spawn(leaser::run(pipeline.clone(), leasing.clone()));
        let mut background = JoinSet::new();
        background.spawn(maintenance::run(pipeline.clone(), claiming.clone()));
        if self.stop_when_empty {
            background.spawn(stop_when_empty(pipeline.clone(), claiming.clone()));
        }
        if self.serial {
            run_serial(&pipeline, &claiming).await;
        } else {
            run_pipeline(&pipeline, &claiming).await;
        }
        claiming.cancel();
        // Upkeep statements are idempotent and each is atomic, so stopping them
        // mid-flight loses nothing; waiting could mean a connect timeout per
        // unreachable shard.
        leasing.cancel();
        leaser.abort();
        let _ = leaser.await;
        background.shutdown().await;
        let report = WorkerReport {
            stats: pipeline.stats.snapshot(),
            elapsed: started.elapsed(),
        };
        tracing::info!(?report, "worker stopped");
        report
    }
}

impl Pipeline {
    /// Starts holding `job`: from its claim until its outcome is written.
    fn hold(&self, job: &crate::job::ClaimedJob) {
        let held = Held {
            shard: job.shard,
            fence: job.fence,
            cancel: CancellationToken::new(),
        };
        self.held.lock().expect("held map").insert(job.id, held);
    }

    /// The cancellation token of held job `id`.
    fn cancel_token(&self, id: crate::job::JobId) -> CancellationToken {
        let held = self.held.lock().expect("held map");
        held.get(&id)
            .map_or_else(CancellationToken::new, |h| h.cancel.clone())
    }

    /// Stops holding these jobs (their outcomes are written or given up).
    fn forget(&self, claims: impl IntoIterator<Item = (crate::job::JobId, i64)>) {
        let mut held = self.held.lock().expect("held map");
        for (id, fence) in claims {
            // Only this claim's entry: the job may have been claimed again
            // since (a lost lease), and that claim is held now.
            if held.get(&id).is_some_and(|h| h.fence == fence) {
                held.remove(&id);
            }
        }
    }

    /// The ids of the held jobs on shard `shard`.
    fn held_ids(&self, shard: usize) -> std::collections::HashSet<crate::job::JobId> {
        let held = self.held.lock().expect("held map");
        held.iter()
            .filter(|(_, h)| h.shard == shard)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The held jobs on shard `shard`, with their fences.
    fn held_on(&self, shard: usize) -> Vec<(crate::job::JobId, i64)> {
        let held = self.held.lock().expect("held map");
        held.iter()
            .filter(|(_, h)| h.shard == shard)
            .map(|(id, h)| (*id, h.fence))
            .collect()
    }

    /// Tells held job `id` that its cancellation was asked: a running handler
    /// sees it; an unstarted job is released instead of started.
    fn cancel_held(&self, id: crate::job::JobId) {
        if let Some(held) = self.held.lock().expect("held map").get(&id) {
            held.cancel.cancel();
        }
    }

    /// Notes that a claim on shard `shard` may have run without its reply.
    fn claim_reply_lost(&self, shard: usize) {
        *self.lost_claim[shard].lock().expect("lost claim") = Some(Instant::now());
    }

    /// When a claim on shard `shard` last may have lost its reply.
    fn last_lost_claim(&self, shard: usize) -> Option<Instant> {
        *self.lost_claim[shard].lock().expect("lost claim")
    }

    /// A new claim's number.
    fn next_claim(&self) -> u64 {
        self.claims
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

fn new_rotation(pipeline: &Pipeline) -> Rotation {
    let start = rand::thread_rng().gen_range(0..pipeline.targets.len());
    Rotation::new(pipeline.targets.len(), start, &pipeline.config.dequeue)
}

async fn run_serial(pipeline: &Arc<Pipeline>, claiming: &CancellationToken) {
    let mut loops = JoinSet::new();
    for _ in 0..pipeline.config.worker.concurrency {
        loops.spawn(serial::run(
            pipeline.clone(),
            new_rotation(pipeline),
            claiming.clone(),
        ));
    }
    while loops.join_next().await.is_some() {}
}

async fn run_pipeline(pipeline: &Arc<Pipeline>, claiming: &CancellationToken) {
    let concurrency = pipeline.config.worker.concurrency;
    let grace = pipeline.config.worker.shutdown_grace;
    let (completions_tx, completions_rx) = tokio::sync::mpsc::unbounded_channel();
    let (shared_tx, shared_rx) = async_channel::unbounded();
    let mut keyed = Vec::with_capacity(concurrency);
    let mut slots = JoinSet::new();
    for _ in 0..concurrency {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        keyed.push(tx);
        slots.spawn(executor::run_slot(
            rx,
            shared_rx.clone(),
            pipeline.clone(),
            completions_tx.clone(),
            claiming.clone(),
        ));
    }
    let abandon = CancellationToken::new();
    let completer = tokio::spawn(completer::run(
        pipeline.clone(),
        completions_rx,
        abandon.clone(),
    ));
    let dispatch = Arc::new(producer::Dispatch {
        keyed,
        shared: shared_tx,
    });
    let mut producers = JoinSet::new();
    for _ in 0..pipeline.config.worker.producers {
        producers.spawn(producer::run(
            pipeline.clone(),
            dispatch.clone(),
            new_rotation(pipeline),
            claiming.clone(),
        ));
    }
    while producers.join_next().await.is_some() {}
    drop(dispatch);

    // Slots finish the job in hand (within the grace period) and stop.
    let mut unstarted = Vec::new();
    let finished = tokio::time::timeout(grace, async {
        while let Some(Ok(mut own)) = slots.join_next().await {
            while let Ok(job) = own.try_recv() {
                unstarted.push(job);
            }
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
    while let Ok(job) = shared_rx.try_recv() {
        unstarted.push(job);
    }
    // Unstarted jobs go back through the completer (released, or cancelled
    // when that was asked), so other workers can take them at once.
    tracing::info!(jobs = unstarted.len(), "releasing unstarted jobs");
    for job in unstarted {
        let _ = completions_tx.send(crate::job::Completion::of(
            &job,
            crate::job::Outcome::Released,
        ));
    }
    drop(completions_tx);
    if tokio::time::timeout(grace, completer).await.is_err() {
        abandon.cancel();
    }
}

async fn stop_when_empty(pipeline: Arc<Pipeline>, claiming: CancellationToken) {
    let client =
        crate::Client::from_shards(pipeline.shards.clone(), pipeline.config.limits.clone());
    loop {
        tokio::select! {
            _ = claiming.cancelled() => return,
            _ = tokio::time::sleep(EMPTY_CHECK_INTERVAL) => {}
        }
        let mut pending = false;
        for queue in &pipeline.config.worker.queues {
            match client.has_pending(queue).await {
                Ok(false) => {}
                Ok(true) | Err(_) => {
                    pending = true;
                    break;
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
