//! What one run measured, before analysis, and the settings every run
//! shares: written by [`super::runner`], read by [`super::analyze`] and
//! [`super::result`].

use super::plan::Mode;
use super::{disturb, fleet, stall, verify};
use std::time::Duration;

/// Settings shared by every run.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// K (where it starts, when adaptive).
    pub slots: u32,
    /// K moves (adaptive) instead of staying fixed.
    pub adaptive_slots: bool,
    /// dequeue.batch_size.
    pub batch: u32,
    /// dequeue.lock_timeout_ms of the disturbance runs.
    pub lock_timeout_ms: u64,
    /// dequeue.unhealthy_backoff_max_ms of the disturbance runs.
    pub unhealthy_backoff_max_ms: u64,
    /// Longest wait for the drain.
    pub timeout: Duration,
    /// worker.buffer_jobs, when given (else [`super::plan::buffer_jobs`]'s default).
    pub buffer_jobs: Option<usize>,
    /// How long each job sleeps (ms); 0: noop jobs.
    pub job_ms: u64,
    /// The disturbance runs keep the library's deadlines and backoff.
    pub worker_defaults: bool,
}

/// What the run did, before analysis.
pub struct Raw {
    /// Jobs enqueued by shard.
    pub enqueued: Vec<u64>,
    /// The fleet's output.
    pub output: fleet::Output,
    /// `go` in ms since the Unix epoch.
    pub go_unix_ms: f64,
    /// The disturbance's real window.
    pub window: Option<disturb::Window>,
    /// The check.
    pub checks: Vec<verify::ShardCheck>,
    /// Where the run's time went.
    pub phases: Phases,
    /// /proc/loadavg at the start.
    pub loadavg: String,
    /// Share of the machine's cores busy from `go` until every job completed.
    pub cpu_busy: f64,
    /// What the shards were doing whenever progress stopped for a while.
    pub stalls: Vec<stall::Stall>,
    /// A proxy disturbance: the statements the workers sent (or had
    /// answered) through the proxy while the fault was on.
    pub fault_statements: Option<usize>,
}

/// Seconds each phase of a run took.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Phases {
    /// Migrate, truncate, checkpoint.
    pub setup_s: f64,
    /// Worker processes started and their pools warm.
    pub start_s: f64,
    /// Drain runs: the backlog inserted (before `go`).
    pub prefill_s: f64,
    /// From `go` until every job completed (and the disturbance ended).
    pub run_s: f64,
    /// Graceful stop of the workers.
    pub stop_s: f64,
    /// The exactly-once check.
    pub check_s: f64,
}

/// The mode's K, for the result.
pub fn slots(mode: Mode, s: &Settings) -> Option<u32> {
    (mode == Mode::Gated).then_some(s.slots)
}
