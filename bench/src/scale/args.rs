//! Flags of `shardq-bench scale` (also `shardq bench scale`).

use super::disturb::Kind;
use super::mode::Mode;
use clap::Args;
use std::path::PathBuf;

/// Flags of `shardq-bench scale`. The shards are local servers it starts
/// itself (`--local N`, the default), or those of the global `--config FILE`.
#[derive(Debug, Clone, Args)]
pub struct ScaleArgs {
    /// The small sweep (1 and 2 shards × 8 and 64 dequeuers × both modes,
    /// latency runs at 64, an ACCESS EXCLUSIVE disturbance on 4 shards);
    /// under 2 minutes. (At 128 dequeuers ungated drains collapse so far
    /// that their run time is unbounded; the full sweep goes there.)
    #[arg(long)]
    pub quick: bool,
    /// Local shards to start (default: as many as the largest shard count used).
    #[arg(long)]
    pub local: Option<usize>,
    /// Shard counts to sweep (the first N shards of the set).
    #[arg(long, value_delimiter = ',')]
    pub shards: Option<Vec<usize>>,
    /// Dequeuers per shard to sweep: W processes × P producers each, every
    /// producer visiting every shard (P = dequeuers / W, rounded up).
    #[arg(long, value_delimiter = ',')]
    pub dequeuers: Option<Vec<usize>>,
    /// Worker processes per run (W).
    #[arg(long, default_value_t = 4)]
    pub processes: usize,
    /// Dequeue slots per shard in gated mode (K): where an adaptive K
    /// starts with --adaptive-slots (within the library's default bounds).
    #[arg(long, default_value_t = 2)]
    pub slots: u32,
    /// Gated workers move K (dequeue.adaptive_slots = true) instead of
    /// keeping it fixed (the library's default).
    #[arg(long)]
    pub adaptive_slots: bool,
    /// Jobs per claim statement (dequeue.batch_size), both modes; 500 is
    /// the library's default.
    #[arg(long, visible_alias = "batch-size", default_value_t = 500)]
    pub batch: u32,
    /// worker.buffer_jobs of every run's workers (default: room for every
    /// producer's claim plus two batches, at least the library's 4,000).
    /// Users with slow jobs set it small (e.g. 200 with --batch 50).
    #[arg(long)]
    pub buffer_jobs: Option<usize>,
    /// How long each job runs (ms): the built-in `sleep` handler; 0 (the
    /// default) enqueues `noop` jobs.
    #[arg(long, default_value_t = 0)]
    pub job_ms: u64,
    /// Drain runs: jobs per shard, inserted before the workers start
    /// claiming (default 15,000 with --quick; else 30,000 or three times
    /// what the fleet's buffers hold, whichever is more).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Steady-state sweep instead of burst-and-drain: offer this many jobs/s
    /// (all shards together) for --duration seconds; a list (`2500,5000`)
    /// runs each rate in every cell, side by side.
    #[arg(long, value_delimiter = ',')]
    pub rate: Option<Vec<f64>>,
    /// Seconds a rate run offers load.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Latency runs (after a drain sweep): jobs/s per shard offered at the
    /// highest dequeuer count, gated and ungated, for every shard count; a
    /// moderate load both modes sustain, so claim latency is not backlog. 0: none.
    #[arg(long, default_value_t = 2_000.0)]
    pub latency_rate: f64,
    /// Seconds a latency run offers load (default 6 with --quick, else 15).
    #[arg(long)]
    pub latency_for: Option<f64>,
    /// Each sweep cell this many times (gated and ungated alternating); the
    /// claims use the median.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Disturbance runs (gated and ungated, at a fixed rate): what to do to
    /// shard 0, one or more (default: access-exclusive with --quick, the
    /// four server-side kinds otherwise; slow, silent and refuse put a
    /// proxy in front of the shard).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub disturb: Option<Vec<Kind>>,
    /// No disturbance runs.
    #[arg(long, conflicts_with = "disturb")]
    pub no_disturb: bool,
    /// Only the disturbance runs: no sweep, no latency runs.
    #[arg(long, conflicts_with = "no_disturb")]
    pub only_disturb: bool,
    /// Seconds after the start of the run.
    #[arg(long)]
    pub disturb_at: Option<f64>,
    /// Seconds the disturbance lasts.
    #[arg(long)]
    pub disturb_for: Option<f64>,
    /// Seconds measured after the disturbance ends.
    #[arg(long)]
    pub disturb_after: Option<f64>,
    /// Shards of the disturbance runs.
    #[arg(long, default_value_t = 4)]
    pub disturb_shards: usize,
    /// Dequeuers per shard of the disturbance runs.
    #[arg(long, default_value_t = 32)]
    pub disturb_dequeuers: usize,
    /// worker.producers of the disturbance runs' processes (then dequeuers
    /// per shard = --processes × this, instead of --disturb-dequeuers).
    #[arg(long)]
    pub producers: Option<usize>,
    /// Which modes the disturbance runs use (default both, gated first).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub disturb_modes: Option<Vec<Mode>>,
    /// Disturbance runs: jobs per shard inserted before the workers start,
    /// on top of --disturb-rate (which may then be 0), so that every shard
    /// has a backlog and the workers run at their capacity before, during
    /// and after the disturbance. Size it to last past the disturbance.
    #[arg(long, default_value_t = 0)]
    pub disturb_backlog: usize,
    /// --disturb slow: how much longer each reply of the shard takes (ms).
    #[arg(long, default_value_t = 300)]
    pub slow_ms: u64,
    /// The disturbance runs' workers keep the library's lock wait,
    /// statement deadline and failing-shard backoff (instead of
    /// --lock-timeout-ms, 1 s statements and --unhealthy-backoff-max-ms).
    #[arg(long)]
    pub worker_defaults: bool,
    /// Jobs/s offered in the disturbance runs (all shards together).
    #[arg(long, default_value_t = 2_000.0)]
    pub disturb_rate: f64,
    /// dequeue.lock_timeout_ms of the workers in the disturbance runs (the
    /// sweep keeps the library default, 2000): how long a claim waits behind
    /// a table lock before the shard is skipped.
    #[arg(long, default_value_t = 200)]
    pub lock_timeout_ms: u64,
    /// dequeue.unhealthy_backoff_max_ms of the workers in the disturbance
    /// runs (the sweep keeps the library default, 10000): the longest a
    /// failing shard is skipped.
    #[arg(long, default_value_t = 500)]
    pub unhealthy_backoff_max_ms: u64,
    /// Seconds a run may take to drain before it is reported as failed.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Experiments on local shards: a server setting for every run's
    /// connections, as KEY=VALUE (`ALTER DATABASE shardq SET KEY = 'VALUE'`),
    /// e.g. plan_cache_mode=force_custom_plan. Repeat for several.
    #[arg(long = "db-set", value_name = "KEY=VALUE")]
    pub db_set: Vec<String>,
    /// Keep the temporary folder (data of local shards, worker configs and logs).
    #[arg(long)]
    pub keep: bool,
    /// The JSON results; the CSV timeline and the SVG plots go beside it.
    #[arg(long, default_value = "bench/results/scale/scale.json")]
    pub out: PathBuf,
}
