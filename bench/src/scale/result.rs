//! What one run measured: the JSON object written per run (schema in the
//! README, "Scale-out benchmark").

use super::disturb;
use super::measure::Percentiles;
use super::plan::{Load, Mode};
use super::timeline::Second;
use super::verify::ShardCheck;
use serde::Serialize;
use shardq::worker::metrics::ShardCountersSnapshot;

/// One run.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// Position in the invocation.
    pub id: usize,
    /// `sweep` (drain), `latency` (fixed rate) or `disturbance` (fixed rate).
    pub kind: &'static str,
    /// `gated` or `ungated`.
    pub mode: Mode,
    /// K in gated mode.
    pub slots: Option<u32>,
    /// Shards used.
    pub shards: usize,
    /// Worker processes (W).
    pub processes: usize,
    /// Producers per process (P).
    pub producers_per_process: usize,
    /// W × P.
    pub dequeuers_per_shard: usize,
    /// Jobs per claim statement.
    pub batch: u32,
    /// `drain` (with `per_shard`) or `rate` (with `rate`, `duration_s`).
    pub load: Load,
    /// Jobs enqueued (all shards).
    pub jobs: u64,
    /// Seconds the throughput is measured over (drain: from 10% to 90% of
    /// the outcomes written, by the workers' counters, so ramp-up and tail
    /// are left out; rate: from 3 s after the start to the end of the offer).
    pub measured_s: f64,
    /// Jobs completed per second over `measured_s`, all shards.
    pub jobs_per_s: f64,
    /// The same by shard.
    pub jobs_per_s_by_shard: Vec<f64>,
    /// Enqueue (row inserted) → handler start, all processes.
    pub claim_latency_ms: Percentiles,
    /// Duration of one claim statement (busy and empty ones included), by shard.
    pub claim_statement_ms: Vec<Percentiles>,
    /// Handler end → outcome committed.
    pub completion_lag_ms: Percentiles,
    /// Counters by shard, summed over processes.
    pub counters: Vec<ShardCountersSnapshot>,
    /// busy / (claims + busy + empty + errors), all shards.
    pub lock_miss_rate: f64,
    /// empty / (claims + busy + empty + errors), all shards.
    pub empty_rate: f64,
    /// The disturbance and what it did.
    pub disturbance: Option<DisturbanceResult>,
    /// Seconds after the disturbance until the disturbed shard's throughput was
    /// back within 10% of its before level: a number, `"never"`, or null (no disturbance).
    pub recovery_s: serde_json::Value,
    /// The exactly-once check, by shard.
    pub check: Vec<ShardCheck>,
    /// Completions the workers' fence rejected (0 expected).
    pub fenced: u64,
    /// What a shard's backends were doing whenever it had claimed jobs
    /// outstanding but wrote no outcome for 2 s (at most 4 snapshots).
    pub stalls: Vec<super::stall::Stall>,
    /// /proc/loadavg when the run started (other work on the machine).
    pub loadavg: String,
    /// Share of the machine's cores busy (any process) from the start of the
    /// run until its last job completed: 1.0 = every core busy all along.
    pub cpu_busy: f64,
    /// Seconds each phase of the run took (setup, start, run, stop, check).
    pub phases: super::raw::Phases,
    /// Whether the run finished and its check passed.
    pub ok: bool,
    /// Why not.
    pub error: Option<String>,
    /// Per-second rates by shard (written to the CSV, not the JSON).
    #[serde(skip)]
    pub seconds: Vec<Second>,
    /// Completions/s by shard in 0.25 s steps, (midpoint s, rates) (for the plots).
    #[serde(skip)]
    pub fine: Vec<(f64, Vec<f64>)>,
}

/// A disturbance run's before/during/after throughput.
#[derive(Debug, Clone, Serialize)]
pub struct DisturbanceResult {
    /// What was planned.
    pub plan: disturb::Plan,
    /// When it really happened (s since the start of the run).
    pub window: disturb::Window,
    /// Completions/s by shard over the 2 s before the disturbance (not before 3 s).
    pub before_jobs_per_s: Vec<f64>,
    /// During it.
    pub during_jobs_per_s: Vec<f64>,
    /// From its end until the offer ends.
    pub after_jobs_per_s: Vec<f64>,
    /// The lowest during/before ratio among the undisturbed shards.
    pub others_kept: f64,
    /// The undisturbed shards together: their completions/s during the
    /// disturbance as a share of theirs before it (None: none before).
    pub healthy_kept: Option<f64>,
    /// during/before by shard (None: nothing completed before).
    pub kept_by_shard: Vec<Option<f64>>,
    /// Seconds from the end of the disturbance until a job of the disturbed
    /// shard was claimed again (None: never within the run).
    pub reclaimed_s: Option<f64>,
    /// Proxy kinds: statements the workers sent to (or had answered by) the
    /// disturbed shard while the fault was on.
    pub fault_statements: Option<usize>,
    /// Recovery of the disturbed shard's completions (s, None = never).
    pub recovery_s: Option<f64>,
    /// Recovery of its claims (jobs claimed/s), to tell claiming from completing.
    pub recovery_claims_s: Option<f64>,
}

impl RunResult {
    /// Claim latency p99 in ms.
    pub fn p99(&self) -> f64 {
        self.claim_latency_ms.p99
    }
}
