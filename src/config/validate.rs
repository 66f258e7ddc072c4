//! Turns the raw file into typed, checked configuration.

mod checks;
mod database;
mod schedule;
mod shard;

pub use super::error::ConfigError;
pub use database::DatabaseConfig;
pub use shard::ShardConfig;

use super::file::{ConfigFile, DequeueModeFile, ShardFile};
use checks::positive;
use schedule::validate_schedules;
use shard::validate_shards;
use std::path::PathBuf;
use std::time::Duration;

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Shards in mapping order.
    pub shards: Vec<ShardConfig>,
    /// Timeouts of every connection and statement.
    pub database: DatabaseConfig,
    /// Dequeue settings.
    pub dequeue: DequeueConfig,
    /// Worker settings.
    pub worker: WorkerConfig,
    /// Local server settings.
    pub local: LocalConfig,
    /// Enqueue limits.
    pub limits: EnqueueLimits,
    /// Retention of finished jobs.
    pub retention: Retention,
    /// Periodic jobs, each checked; a worker runs them all (add more in code
    /// with [`crate::Worker::schedule`]).
    pub schedules: Vec<crate::schedule::Schedule>,
}

/// Whether claims pass through the advisory-lock dequeue slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DequeueMode {
    /// At most `slots` claims per shard and queue run at once.
    Gated {
        /// K, at least 1.
        slots: u32,
    },
    /// Plain `FOR UPDATE SKIP LOCKED`, for comparison.
    Ungated,
}

/// Bounds of an adaptive K (`dequeue.slots_min`, `dequeue.slots_max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotBounds {
    /// Fewest slots, at least 1.
    pub min: u32,
    /// Most slots.
    pub max: u32,
}

/// A jittered, bounded backoff range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Shortest delay.
    pub min: Duration,
    /// Longest delay.
    pub max: Duration,
}

/// Dequeue settings, checked.
#[derive(Debug, Clone)]
pub struct DequeueConfig {
    /// Gated or not; in gated mode, the K a process starts with.
    pub mode: DequeueMode,
    /// In gated mode, the bounds K moves within per shard and queue, from
    /// what each process sees (`None`: K stays fixed).
    pub adaptive_slots: Option<SlotBounds>,
    /// Jobs per claim statement.
    pub batch_size: u32,
    /// Skip time for a shard with no ready job.
    pub empty_backoff: Backoff,
    /// Skip time for a shard with no ready job while the process listens
    /// for its wake-ups.
    pub idle_poll: Backoff,
    /// Least time from a claim that found a target caught up to the next
    /// claim a wake-up lets in there.
    pub wake_cooldown: Duration,
    /// Longest a producer waits on one shard's claim
    /// (`dequeue.claim_budget_max_ms`).
    pub claim_budget_max: Duration,
    /// Pause after every shard answered busy.
    pub busy_backoff: Backoff,
    /// Retry delay for a failing shard.
    pub unhealthy_backoff: Backoff,
}

/// Worker settings, checked.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Queues to serve.
    pub queues: Vec<String>,
    /// Executor slots.
    pub concurrency: usize,
    /// Producers.
    pub producers: usize,
    /// Claimed-but-unfinished jobs held at most.
    pub buffer_jobs: usize,
    /// Lease length.
    pub lease: Duration,
    /// Completions per statement.
    pub completion_batch: usize,
    /// Longest wait before a completion is written.
    pub completion_flush: Duration,
    /// Upkeep period per shard (lease recovery, promotion of due jobs).
    pub maintenance_interval: Duration,
    /// Retry delays of failed jobs.
    pub retry_backoff: Backoff,
    /// Time running handlers get to finish at shutdown.
    pub shutdown_grace: Duration,
    /// Longest a handler may run (`None`: no limit).
    pub handler_timeout: Option<Duration>,
}

/// Local server settings.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// Data folder root.
    pub dir: PathBuf,
    /// Port of server 0.
    pub base_port: u16,
    /// Default server count.
    pub shards: usize,
}

/// Shortest claim budget: a healthy claim on a loaded host (a batch of
/// hundreds of rows, two cores shared with the servers) rarely takes longer;
/// a budget below it would make healthy shards suspect on a scheduler hiccup.
pub(crate) const CLAIM_BUDGET_MIN: Duration = Duration::from_millis(100);

/// Enqueue limits: defined with the jobs they limit, so that `job` and
/// `schedule` need nothing of the config.
use crate::job::EnqueueLimits;

/// Retention of finished jobs.
#[derive(Debug, Clone)]
pub struct Retention {
    /// Age after which finished jobs are deleted.
    pub finished_after: Duration,
    /// Rows per delete statement.
    pub batch: i64,
    /// Sweep period per shard.
    pub interval: Duration,
}

/// Connections a worker process uses on each shard besides its producers':
/// two completion writes in flight, the leaser, the maintenance loop, the
/// promoter, and one for a client call (the empty check, a transactional
/// enqueue).
pub(crate) const UPKEEP_CONNECTIONS: usize = 6;

pub(super) fn validate(raw: ConfigFile) -> Result<Config, ConfigError> {
    let local = LocalConfig {
        dir: raw.local.dir,
        base_port: raw.local.base_port,
        shards: positive("local.shards", raw.local.shards)?,
    };
    let shard_files = match raw.shards {
        Some(shards) => shards,
        None => local_shard_files(&local),
    };
    let shards = validate_shards(shard_files, raw.worker.producers + UPKEEP_CONNECTIONS)?;

    let d = raw.dequeue;
    let db_ms = database::database_ms(&raw.database, &d)?;
    let database = database::database(&db_ms)?;
    let mode = match d.mode {
        DequeueModeFile::Gated => DequeueMode::Gated {
            slots: positive("dequeue.slots_per_shard", d.slots_per_shard as usize)? as u32,
        },
        DequeueModeFile::Ungated => DequeueMode::Ungated,
    };
    let batch_size = positive("dequeue.batch_size", d.batch_size as usize)? as u32;
    let adaptive_slots = match mode {
        DequeueMode::Gated { slots } if d.adaptive_slots => Some(slot_bounds(&d, slots)?),
        _ => None,
    };
    let dequeue = DequeueConfig {
        mode,
        adaptive_slots,
        batch_size,
        empty_backoff: backoff(
            "dequeue.empty_backoff_max_ms",
            d.empty_backoff_min_ms,
            d.empty_backoff_max_ms,
        )?,
        idle_poll: backoff(
            "dequeue.idle_poll_ms",
            d.idle_poll_ms / 2,
            positive("dequeue.idle_poll_ms", d.idle_poll_ms as usize)? as u64,
        )?,
        wake_cooldown: wake_cooldown(d.wake_cooldown_ms, d.idle_poll_ms)?,
        claim_budget_max: claim_budget_max(d.claim_budget_max_ms, db_ms.statement_timeout)?,
        busy_backoff: backoff(
            "dequeue.busy_backoff_max_ms",
            d.busy_backoff_min_ms,
            d.busy_backoff_max_ms,
        )?,
        unhealthy_backoff: backoff(
            "dequeue.unhealthy_backoff_max_ms",
            d.unhealthy_backoff_min_ms,
            d.unhealthy_backoff_max_ms,
        )?,
    };

    let w = raw.worker;
    if w.queues.is_empty() {
        return Err(ConfigError::Invalid {
            key: "worker.queues",
            value: "[]".into(),
            fix: "name at least one queue",
        });
    }
    if w.buffer_jobs < batch_size as usize {
        return Err(ConfigError::Invalid {
            key: "worker.buffer_jobs",
            value: w.buffer_jobs.to_string(),
            fix: "must be at least dequeue.batch_size (a few batches deep is best)",
        });
    }
    let worker = WorkerConfig {
        queues: w.queues,
        concurrency: positive("worker.concurrency", w.concurrency)?,
        producers: positive("worker.producers", w.producers)?,
        buffer_jobs: w.buffer_jobs,
        lease: Duration::from_millis(at_most(
            "worker.lease_ms",
            positive("worker.lease_ms", w.lease_ms as usize)? as u64,
            MAX_LEASE_MS,
            "must be at most 86400000 (a day): a crashed worker's jobs wait this long, \
             and a long job needs no long lease (leases are renewed every third of one)",
        )?),
        completion_batch: at_most(
            "worker.completion_batch",
            positive("worker.completion_batch", w.completion_batch)? as u64,
            MAX_COMPLETION_BATCH as u64,
            "must be at most 5000: one completion statement holds its rows' locks \
             until it commits, and more gains nothing",
        )? as usize,
        completion_flush: Duration::from_millis(w.completion_flush_ms),
        maintenance_interval: Duration::from_millis(positive(
            "worker.maintenance_interval_ms",
            w.maintenance_interval_ms as usize,
        )? as u64),
        retry_backoff: backoff(
            "worker.retry_backoff_max_ms",
            w.retry_backoff_min_ms,
            at_most(
                "worker.retry_backoff_max_ms",
                w.retry_backoff_max_ms,
                MAX_RETRY_BACKOFF_MS,
                "must be at most 604800000 (a week): a later retry is a schedule, not a backoff",
            )?,
        )?,
        shutdown_grace: Duration::from_millis(w.shutdown_grace_ms),
        handler_timeout: (w.handler_timeout_ms > 0)
            .then(|| Duration::from_millis(w.handler_timeout_ms)),
    };
    let limits = EnqueueLimits {
        max_payload_bytes: positive("limits.max_payload_bytes", raw.limits.max_payload_bytes)?,
        default_max_attempts: at_most(
            "limits.default_max_attempts",
            positive(
                "limits.default_max_attempts",
                raw.limits.default_max_attempts.max(0) as usize,
            )? as u64,
            crate::job::MAX_ATTEMPTS as u64,
            "must be at most 1000: more attempts never end a failing job, they only retry it forever",
        )? as i32,
    };
    let r = raw.retention;
    let retention = Retention {
        finished_after: Duration::from_millis(r.finished_after_ms),
        batch: positive("retention.batch", r.batch.max(0) as usize)? as i64,
        interval: Duration::from_millis(
            positive("retention.interval_ms", r.interval_ms as usize)? as u64
        ),
    };
    let schedules = validate_schedules(raw.schedules, &limits)?;
    Ok(Config {
        shards,
        database,
        dequeue,
        worker,
        local,
        limits,
        retention,
        schedules,
    })
}

fn local_shard_files(local: &LocalConfig) -> Vec<ShardFile> {
    (0..local.shards)
        .map(|i| {
            ShardFile::from_url(
                format!("local-{i}"),
                format!(
                    "postgres://postgres@127.0.0.1:{}/shardq",
                    local.base_port as usize + i
                ),
            )
        })
        .collect()
}

/// The longest lease (`worker.lease_ms`): 24 h, in ms.
const MAX_LEASE_MS: u64 = 24 * 3600 * 1000;

/// The longest retry backoff (`worker.retry_backoff_max_ms`): 7 days, in ms.
/// It also keeps `now() + delay` and the backoff arithmetic of the
/// completion far from any overflow.
const MAX_RETRY_BACKOFF_MS: u64 = 7 * 24 * 3600 * 1000;

/// The most completions per statement (`worker.completion_batch`): a few
/// thousand rows already make one statement's cost per row flat.
const MAX_COMPLETION_BATCH: usize = 5_000;

/// `value` when it is at most `max`; else the error naming `key`, with `fix`
/// (which states `max`).
fn at_most(key: &'static str, value: u64, max: u64, fix: &'static str) -> Result<u64, ConfigError> {
    if value > max {
        return Err(ConfigError::Invalid {
            key,
            value: value.to_string(),
            fix,
        });
    }
    Ok(value)
}

/// The wake-up cooldown: a wake-up reopens a caught-up target no sooner than
/// this, so one longer than the fallback poll would hold jobs back longer
/// than polling alone does.
fn wake_cooldown(cooldown_ms: u64, idle_poll_ms: u64) -> Result<Duration, ConfigError> {
    if cooldown_ms > idle_poll_ms / 2 {
        return Err(ConfigError::Invalid {
            key: "dequeue.wake_cooldown_ms",
            value: cooldown_ms.to_string(),
            fix: "must not exceed half of dequeue.idle_poll_ms (tens of ms at most is what it is for)",
        });
    }
    Ok(Duration::from_millis(cooldown_ms))
}

/// The ceiling of a producer's wait on one shard: at least the budget's
/// floor, and within a statement's deadline (past which the claim fails
/// anyway).
fn claim_budget_max(budget_ms: u64, statement_timeout_ms: u64) -> Result<Duration, ConfigError> {
    let floor = CLAIM_BUDGET_MIN.as_millis() as u64;
    if budget_ms < floor || budget_ms > statement_timeout_ms {
        return Err(ConfigError::Invalid {
            key: "dequeue.claim_budget_max_ms",
            value: budget_ms.to_string(),
            fix: "must be at least 100 and at most database.statement_timeout_ms (250 suits shards on one network)",
        });
    }
    Ok(Duration::from_millis(budget_ms))
}

/// The bounds of an adaptive K, which must hold the starting K.
fn slot_bounds(d: &super::file::DequeueFile, initial: u32) -> Result<SlotBounds, ConfigError> {
    let min = positive("dequeue.slots_min", d.slots_min as usize)? as u32;
    if d.slots_max < min {
        return Err(ConfigError::Invalid {
            key: "dequeue.slots_max",
            value: d.slots_max.to_string(),
            fix: "must be at least dequeue.slots_min",
        });
    }
    if !(min..=d.slots_max).contains(&initial) {
        return Err(ConfigError::Invalid {
            key: "dequeue.slots_per_shard",
            value: initial.to_string(),
            fix: "with adaptive_slots, K starts within slots_min..=slots_max: change one of \
                  them, or set adaptive_slots = false",
        });
    }
    Ok(SlotBounds {
        min,
        max: d.slots_max,
    })
}

fn backoff(key: &'static str, min_ms: u64, max_ms: u64) -> Result<Backoff, ConfigError> {
    if max_ms < min_ms {
        return Err(ConfigError::Invalid {
            key,
            value: max_ms.to_string(),
            fix: "must not be below the matching _min_ms",
        });
    }
    Ok(Backoff {
        min: Duration::from_millis(min_ms),
        max: Duration::from_millis(max_ms),
    })
}
