//! Command-line arguments.

use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

/// shardq: a durable job queue on sharded PostgreSQL.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// Configuration file (default: ./shards.toml when present, else 4 local shards).
    #[arg(long, global = true, env = "SHARDQ_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start, stop or inspect local PostgreSQL servers (one per shard).
    Local {
        #[command(subcommand)]
        action: LocalAction,
    },
    /// Apply missing schema migrations to every shard.
    Migrate,
    /// Enqueue jobs.
    Enqueue(EnqueueArgs),
    /// Run a worker until SIGINT/SIGTERM (or until the queue is empty).
    Worker(WorkerArgs),
    /// Show, cancel or retry one job.
    Job {
        #[command(subcommand)]
        action: JobAction,
    },
    /// Pause, resume or list paused queues (on every shard).
    Queue {
        #[command(subcommand)]
        action: QueueAction,
    },
    /// Set, list or clear fleet-wide queue limits (stored on every shard).
    Limit {
        #[command(subcommand)]
        action: LimitAction,
    },
    /// The shard map: its epoch, each key range and its shard, and the
    /// unfinished jobs of each range per shard.
    Shards {
        #[command(subcommand)]
        action: ShardsAction,
    },
    /// Move the shard map to a new shard list while the fleet runs: plan
    /// the range moves, copy each range's unclaimed jobs to its new shard,
    /// release them once the old shard finished the range's running jobs.
    ///
    /// `--config` names the current list, `--to` the new one: the current
    /// shards in the same order, followed by the shards that join (growing),
    /// or the first shards of the current list (shrinking). Shards that join
    /// are migrated first. Stopped at any point, running the command again
    /// finishes the move (docs/operations.md).
    Reshard(ReshardArgs),
    /// Per queue: jobs by state summed over every shard, the oldest ready
    /// job and the shard it is on; then any shard that did not answer, or
    /// whose waiting and scheduled jobs took too long to count (bounded).
    /// `--shards` adds each shard's own counts and connections.
    Status {
        /// Each shard's own counts and connections too.
        #[arg(long)]
        shards: bool,
        /// Print JSON (`queues`, `unanswered`, `bounded`, and `shards`) instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Check every shard's invariants (stranded keys, a key running twice,
    /// stale leases and due jobs, job states, the shard map) from one
    /// snapshot per shard.
    ///
    /// Exits 0 when every invariant holds on every shard, 3 when one is
    /// broken, 4 when none is broken but a shard did not answer (1 for any
    /// other error, such as a bad configuration).
    Check(CheckArgs),
    /// Serve the web dashboard over every shard (HTML, no JavaScript).
    Dashboard(DashboardArgs),
    /// Serve every shard's backlog (queue depth, oldest ready age, shard up)
    /// and the invariants of `shardq check` (`shardq_invariant_violations`)
    /// as Prometheus metrics: one exporter per fleet, not one per worker.
    Metrics(MetricsArgs),
    /// Start local shards, migrate, enqueue noop jobs, drain them, print the throughput.
    Demo {
        /// Jobs to enqueue and drain.
        #[arg(long, default_value_t = 200_000)]
        jobs: usize,
    },
    /// Benchmarks that start their own PostgreSQL servers: `shardq bench
    /// pipeline|scale …` runs `shardq-bench pipeline|scale …` (see `shardq bench --help`).
    #[command(disable_help_flag = true)]
    Bench {
        /// The benchmark and its flags, passed to `shardq-bench`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Run jobs under injected faults on fresh local shards and check nothing was lost.
    ///
    /// Runs `shardq-bench chaos …` (see `shardq chaos --help`): kills workers,
    /// restarts a shard, kills connections, locks and rewrites the queue table;
    /// then checks that no job was lost or completed twice and that no recorded
    /// step ran again. Exits 1 when an invariant fails.
    #[command(disable_help_flag = true)]
    Chaos {
        /// Flags of the chaos run, passed to `shardq-bench chaos`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

#[derive(Debug, Args)]
pub struct ReshardArgs {
    /// The new shard list (a config file with its `[[shards]]`).
    #[arg(long)]
    pub to: PathBuf,
    /// Print the plan (the ranges that move, from and to which shard) and
    /// change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Give up, with an error, when the move makes no progress for this
    /// many seconds (a shard that does not answer, a job that never
    /// finishes). The move stays recorded: run the command again to go on.
    /// Without it the command waits, printing each retry.
    #[arg(long, value_name = "SECONDS")]
    pub give_up_after: Option<u64>,
    /// Stop after this step (recorded, opened, copied), to test resuming.
    #[arg(long, hide = true)]
    pub stop_after: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ShardsAction {
    /// Print the current map (the highest epoch the shards record): each
    /// range `first..end → shard` with its unfinished jobs per shard.
    Show {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum LocalAction {
    /// Start the servers (reuses running ones) and create their databases.
    Up {
        /// How many servers (default: local.shards of the config).
        #[arg(long)]
        shards: Option<usize>,
    },
    /// Stop the servers.
    Down {
        /// How many servers (default: local.shards of the config).
        #[arg(long)]
        shards: Option<usize>,
    },
    /// Say which servers are up.
    Status {
        /// How many servers (default: local.shards of the config).
        #[arg(long)]
        shards: Option<usize>,
    },
}

#[derive(Debug, Subcommand)]
pub enum JobAction {
    /// Print everything stored about a job, as JSON.
    Show {
        /// Job id, SHARDKEY-ID as printed by enqueue.
        id: shardq::JobId,
    },
    /// Cancel a job: a waiting one never runs; a running one is told to stop.
    Cancel {
        /// Job id.
        id: shardq::JobId,
    },
    /// Put a dead or cancelled job back in the queue with fresh attempts.
    Retry {
        /// Job id.
        id: shardq::JobId,
    },
}

#[derive(Debug, Subcommand)]
pub enum QueueAction {
    /// Stop every worker claiming the queue's jobs (within a claim); running
    /// jobs finish, enqueueing goes on, the pause survives restarts.
    Pause {
        /// Queue name.
        queue: String,
    },
    /// Let workers claim the queue's jobs again (idle workers wake at once).
    Resume {
        /// Queue name.
        queue: String,
    },
    /// List the paused queues and the shards each is paused on.
    List {
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum LimitAction {
    /// Limit a queue across every worker process and shard (replacing its
    /// limits); running workers follow within a second.
    Set {
        /// Queue name.
        #[arg(long)]
        queue: String,
        /// Jobs of the queue running at once across the fleet (a claimed
        /// job counts from its claim until its outcome is written).
        #[arg(long, required_unless_present_any = ["rate", "group_concurrency", "group_rate"])]
        concurrency: Option<u32>,
        /// Jobs of the queue started per period across the fleet: `N/s`,
        /// `N/min`, `N/h`, or `N/<D>s`, `N/<D>ms` (e.g. `100/s`, `1000/min`,
        /// `10/500ms`).
        #[arg(long, value_parser = crate::rate::parse_rate)]
        rate: Option<shardq::client::StartRate>,
        /// Jobs of each group of the queue (`enqueue --group`) running at
        /// once, each group on its own.
        #[arg(long)]
        group_concurrency: Option<u32>,
        /// Jobs of each group of the queue started per period, each group
        /// on its own (`N/PERIOD` as `--rate`).
        #[arg(long, value_parser = crate::rate::parse_rate)]
        group_rate: Option<shardq::client::StartRate>,
    },
    /// List the limited queues and the permits the workers hold now.
    List {
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Lift a queue's limits.
    Clear {
        /// Queue name.
        #[arg(long)]
        queue: String,
    },
}

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// Queue name.
    #[arg(long, default_value = "default")]
    pub queue: String,
    /// How many copies of the job.
    #[arg(long, default_value_t = 1)]
    pub count: usize,
    /// Handler name.
    #[arg(long, default_value = "noop")]
    pub handler: String,
    /// JSON payload.
    #[arg(long, default_value = "{}")]
    pub payload: String,
    /// Ordering key (routes the job and orders it among jobs of the same key).
    #[arg(long, conflicts_with = "group")]
    pub key: Option<String>,
    /// Group (a tenant, an account): the queue's groups take turns in
    /// claims and each has the queue's group limits (`limit set
    /// --group-concurrency`). Routes the job: a group's jobs share a shard.
    #[arg(long)]
    pub group: Option<String>,
    /// Priority: lower runs first.
    #[arg(long, default_value_t = 0)]
    pub priority: i32,
    /// Not claimable before this many milliseconds have passed.
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
    /// Attempts before the job is dead (default: limits.default_max_attempts).
    #[arg(long)]
    pub max_attempts: Option<i32>,
    /// Print the job ids, one per line.
    #[arg(long)]
    pub print_ids: bool,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Queues to serve (repeat the flag for several; default: worker.queues).
    #[arg(long)]
    pub queue: Vec<String>,
    /// Executor slots (default: worker.concurrency).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Exit 0 once no shard has a queued or running job of the queues.
    #[arg(long)]
    pub until_empty: bool,
    /// Print the final report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Serve this worker's Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// Address to serve http://ADDR/metrics on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9465")]
    pub listen: std::net::SocketAddr,
    /// Longest a scrape waits for one shard; a shard that takes longer is
    /// reported as `shardq_shard_up 0` (and `shardq_invariant_check_up 0`).
    /// Past half of it, the backlog counts only ready and running jobs
    /// (`shardq_shard_backlog_bounded 1`).
    #[arg(long, default_value_t = 2000)]
    pub shard_timeout_ms: u64,
}

#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// Address to listen on. Beyond loopback it needs authentication
    /// (SHARDQ_DASHBOARD_TOKEN, SHARDQ_DASHBOARD_BASIC_AUTH or the files below).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// No actions: no retry or cancel buttons, and their POSTs are refused.
    #[arg(long)]
    pub read_only: bool,
    /// File holding the bearer token requests must carry (instead of SHARDQ_DASHBOARD_TOKEN).
    #[arg(long, env = "SHARDQ_DASHBOARD_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// File holding `user:password` for basic auth (instead of SHARDQ_DASHBOARD_BASIC_AUTH).
    #[arg(long, env = "SHARDQ_DASHBOARD_BASIC_AUTH_FILE")]
    pub basic_auth_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// A lease expired, or a scheduled job due, longer ago than this is a
    /// violation (default: 2 x worker.maintenance_interval_ms + 10 s).
    #[arg(long, value_name = "MS")]
    pub stale_after_ms: Option<u64>,
    /// Longest wait for one shard; a shard that takes longer did not answer.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    pub shard_timeout_ms: u64,
    /// Rows read per window when judging job states (each unfinished
    /// state, the latest finished, the newest jobs; every running job besides).
    #[arg(long, value_name = "N", default_value_t = shardq::client::DEFAULT_STATE_ROWS)]
    pub state_rows: u32,
    /// Keyed unfinished index entries read when looking for stranded keys.
    #[arg(long, value_name = "N", default_value_t = shardq::client::DEFAULT_KEY_ENTRIES)]
    pub key_entries: u32,
    /// Example jobs shown per invariant and shard.
    #[arg(long, value_name = "N", default_value_t = shardq::client::DEFAULT_EXAMPLES)]
    pub examples: u32,
    /// Unreceived messages, and scheduled rows due within a parked
    /// parent's re-check, read when looking for lost wake-ups.
    #[arg(long, value_name = "N", default_value_t = shardq::client::DEFAULT_WAIT_ENTRIES)]
    pub wait_entries: u32,
    /// A child finished, or a workflow cancelled, longer ago than this
    /// without its parent woken or its children cancelled is a violation.
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    pub child_grace_ms: u64,
}
