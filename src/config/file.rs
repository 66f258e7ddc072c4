//! The raw configuration as written in `shards.toml` and `SHARDQ_*` variables.
//!
//! These structs mirror the file one to one; [`super::validate`] turns them
//! into typed, checked values.

use serde::Deserialize;
use std::path::PathBuf;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The shards, in order: a job's `shard_key` maps onto this list by range
    /// (see `router`). When absent, the local servers of `[local]` are used.
    #[serde(default)]
    pub shards: Option<Vec<ShardFile>>,
    /// Every connection and statement shardq makes on a shard: timeouts.
    #[serde(default)]
    pub database: DatabaseFile,
    /// How workers take jobs from a shard.
    #[serde(default)]
    pub dequeue: DequeueFile,
    /// How a worker process runs jobs.
    #[serde(default)]
    pub worker: WorkerFile,
    /// Where `shardq local` keeps the PostgreSQL servers it starts itself.
    #[serde(default)]
    pub local: LocalFile,
    /// Limits on what may be enqueued.
    #[serde(default)]
    pub limits: LimitsFile,
    /// How long finished jobs are kept.
    #[serde(default)]
    pub retention: RetentionFile,
    /// Periodic jobs (`[[schedules]]`), run by every worker process; each
    /// tick is enqueued once across the fleet.
    #[serde(default)]
    pub schedules: Vec<ScheduleFile>,
}

/// One periodic job (see docs/operations.md, "Periodic jobs").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleFile {
    /// Unique name: it routes the schedule to its shard and keys its last tick there.
    pub name: String,
    /// Cron expression: 5 fields (minute hour day-of-month month
    /// day-of-week), or 6 with seconds first; `@daily` and the like work too.
    pub cron: String,
    /// IANA time zone the expression is read in, e.g. `"Europe/Berlin"`.
    #[serde(default = "default_timezone")]
    pub timezone: String,
    /// Queue of its jobs.
    pub queue: String,
    /// Handler of its jobs.
    pub handler: String,
    /// Payload of its jobs (a TOML table or any TOML value); `{}` by default.
    #[serde(default)]
    pub payload: Option<serde_json::Value>,
    /// Ticks missed while no worker ran: `"skip"` (enqueue none) or
    /// `"run_once"` (enqueue one job for the whole missed period).
    #[serde(default = "default_missed")]
    pub missed: String,
}

/// One shard: a PostgreSQL database, given by URL or by its parts.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardFile {
    /// Unique name, used in logs and `shardq status`.
    pub name: String,
    /// `postgres://user[:password]@host:port/dbname`; exclusive with the parts below.
    pub url: Option<String>,
    /// Host name or address (when no `url`).
    pub host: Option<String>,
    /// Port (when no `url`); 5432 by default.
    pub port: Option<u16>,
    /// Database name (when no `url`); `shardq` by default.
    pub dbname: Option<String>,
    /// User (when no `url`); `postgres` by default.
    pub user: Option<String>,
    /// Password (when no `url`); prefer `password_file` or the URL from the environment.
    pub password: Option<String>,
    /// File whose first line is the password.
    pub password_file: Option<PathBuf>,
    /// Environment variable holding the password, e.g. `"PGPASSWORD_SHARD0"`.
    pub password_env: Option<String>,
    /// TLS as libpq's `sslmode`: `"disable"` (the default), `"require"`
    /// (encrypted, certificate not checked) or `"verify-full"` (certificate
    /// checked against `sslrootcert` and the host name). Also read from a
    /// `?sslmode=` in `url`.
    pub sslmode: Option<String>,
    /// PEM file of the CA certificate(s) that signed the server's certificate;
    /// required by `verify-full`. Also read from a `?sslrootcert=` in `url`.
    pub sslrootcert: Option<PathBuf>,
    /// Connections this process may open to the shard; by default what a
    /// worker process needs (`worker.producers` + 6, see docs/operations.md,
    /// "Sizing connections").
    pub pool_size: Option<usize>,
    /// The URL reaches the shard through a transaction-pooling proxy
    /// (PgBouncer `pool_mode = transaction`): no session settings are sent
    /// at connect time (the proxy refuses them). See docs/operations.md,
    /// "Behind PgBouncer".
    #[serde(default)]
    pub transaction_pooler: bool,
}

impl ShardFile {
    /// A shard given by its URL alone, every other key at its default.
    pub fn from_url(name: impl Into<String>, url: impl Into<String>) -> ShardFile {
        ShardFile {
            name: name.into(),
            url: Some(url.into()),
            host: None,
            port: None,
            dbname: None,
            user: None,
            password: None,
            password_file: None,
            password_env: None,
            sslmode: None,
            sslrootcert: None,
            pool_size: None,
            transaction_pooler: false,
        }
    }
}

impl std::fmt::Debug for ShardFile {
    // Hand-written so that a password in `url` or `password` never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardFile")
            .field("name", &self.name)
            .field("url", &self.url.as_deref().map(super::redact::redact_url))
            .field("host", &self.host)
            .field("port", &self.port)
            .field("dbname", &self.dbname)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("password_file", &self.password_file)
            .field("password_env", &self.password_env)
            .field("sslmode", &self.sslmode)
            .field("sslrootcert", &self.sslrootcert)
            .field("pool_size", &self.pool_size)
            .field("transaction_pooler", &self.transaction_pooler)
            .finish()
    }
}

/// Dequeue settings: the gate, the skips and the budget (see
/// docs/configuration.md and docs/architecture.md, "Dequeue").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DequeueFile {
    /// `gated` (advisory-lock dequeue slots) or `ungated` (plain SKIP LOCKED, for comparison).
    #[serde(default)]
    pub mode: DequeueModeFile,
    /// K: how many claims may run at once on one shard for one queue. Two saturate
    /// a shard with large batches on the 2-core machine the benchmarks ran on. With
    /// `adaptive_slots`, the K each process starts with.
    #[serde(default = "default_slots")]
    pub slots_per_shard: u32,
    /// Whether each process moves K per shard and queue (default off) within
    /// `slots_min..=slots_max`: up while its attempts miss at a steady claim
    /// cost, halved when claims get twice as slow per row (contention).
    #[serde(default = "default_adaptive_slots")]
    pub adaptive_slots: bool,
    /// Fewest slots an adaptive K goes down to.
    #[serde(default = "default_slots_min")]
    pub slots_min: u32,
    /// Most slots an adaptive K goes up to: the most claims that can run at
    /// once on a shard for a queue, however many processes there are.
    #[serde(default = "default_slots_max")]
    pub slots_max: u32,
    /// Jobs claimed by one statement. Large batches let the few gated
    /// claimers saturate the shard (the statement ceiling peaks at 2
    /// dequeuers with batches of 1,000; docs/benchmarks.md).
    #[serde(default = "default_batch")]
    pub batch_size: u32,
    /// Shortest time a shard that returned no job is skipped by every
    /// producer of the process (idle polling cost vs. pickup latency).
    #[serde(default = "default_empty_min")]
    pub empty_backoff_min_ms: u64,
    /// Longest time a shard that returned no job is skipped (jitter spreads the two).
    #[serde(default = "default_empty_max")]
    pub empty_backoff_max_ms: u64,
    /// How long a shard that returned no job is skipped while the process
    /// listens to it (`LISTEN shardq_ready`): new jobs wake the producers at
    /// once, so this is only the fallback poll for a lost notification
    /// (jittered between half of it and all of it).
    #[serde(default = "default_idle_poll")]
    pub idle_poll_ms: u64,
    /// After a claim found a shard's queue caught up, the least time before
    /// a wake-up lets this process claim there again (0: at once). Every
    /// process hears every notification and only one finds the job, so this
    /// bounds each process's claims per queue and shard under a steady offer;
    /// a job that arrives after a quiet spell is claimed at once.
    #[serde(default = "default_wake_cooldown")]
    pub wake_cooldown_ms: u64,
    /// First time a shard that answered busy is skipped by every producer of
    /// the process; doubles while it stays busy.
    #[serde(default = "default_busy_min")]
    pub busy_backoff_min_ms: u64,
    /// Ceiling of that skip: hot retries starve the slot holders, long ones
    /// leave a freed slot idle.
    #[serde(default = "default_busy_max")]
    pub busy_backoff_max_ms: u64,
    /// First retry delay for a shard whose connection failed.
    #[serde(default = "default_unhealthy_min")]
    pub unhealthy_backoff_min_ms: u64,
    /// Retry delay ceiling for a failing shard.
    #[serde(default = "default_unhealthy_max")]
    pub unhealthy_backoff_max_ms: u64,
    /// Deprecated: `database.lock_timeout_ms` (it governs every statement,
    /// not only dequeues). Accepted with a warning.
    pub lock_timeout_ms: Option<u64>,
    /// Deprecated: `database.connect_timeout_ms`. Accepted with a warning.
    pub connect_timeout_ms: Option<u64>,
    /// Deprecated: `database.statement_timeout_ms`. Accepted with a warning.
    pub statement_timeout_ms: Option<u64>,
    /// Longest a producer waits on one shard's claim before it leaves the
    /// claim to a task of its own and skips the shard until a probe says it
    /// answers again (the wait is 4x the shard's recent answer time, within
    /// 100 ms and this). Raise it for shards whose round trip is this long
    /// (another region): a shard that cannot answer within it is not used.
    #[serde(default = "default_claim_budget_max")]
    pub claim_budget_max_ms: u64,
}

/// `dequeue.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DequeueModeFile {
    /// Claims take one of `slots_per_shard` advisory-lock slots per shard and queue.
    #[default]
    Gated,
    /// Plain `FOR UPDATE SKIP LOCKED`, for comparison.
    Ungated,
}

/// `[database]`: what every connection and statement shardq makes on a
/// shard obeys, whichever role makes it (claims, completions, lease
/// extensions, upkeep, the client). Each key is also accepted under
/// `[dequeue]`, its old place, with a deprecation warning.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseFile {
    /// Server-side `lock_timeout` for shardq's statements: a table-lock stall on
    /// one shard turns into an error (and a skipped shard) instead of a hang.
    /// 0 turns it off. Default 2000.
    pub lock_timeout_ms: Option<u64>,
    /// Connect timeout for one shard connection. Default 3000.
    pub connect_timeout_ms: Option<u64>,
    /// Deadline of every statement shardq runs (server-side
    /// `statement_timeout`, and a client-side deadline for a server that
    /// stops answering without closing the connection). Default 10000.
    pub statement_timeout_ms: Option<u64>,
}

/// Worker settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerFile {
    /// Queues this worker takes jobs from.
    #[serde(default = "default_queues")]
    pub queues: Vec<String>,
    /// Executor slots: how many handlers run at once in one process.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Producers per process; each claims batches while rotating over the shards.
    #[serde(default = "default_producers")]
    pub producers: usize,
    /// Jobs the process may hold claimed but not yet completed (the ready buffer
    /// plus jobs running plus completions not yet written). Bounds memory.
    #[serde(default = "default_buffer_jobs")]
    pub buffer_jobs: usize,
    /// How long a claim is valid before another worker may recover the job.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// Completions written per shard in one statement.
    #[serde(default = "default_completion_batch")]
    pub completion_batch: usize,
    /// Longest a completion waits before it is written, so latency stays bounded at low rates.
    #[serde(default = "default_completion_flush_ms")]
    pub completion_flush_ms: u64,
    /// How often each shard's upkeep runs: expired leases recovered, due
    /// delayed and retrying jobs made ready (so this bounds their extra delay).
    #[serde(default = "default_maintenance_interval_ms")]
    pub maintenance_interval_ms: u64,
    /// First retry delay of a failed job; doubles per attempt, with jitter.
    #[serde(default = "default_retry_backoff_min_ms")]
    pub retry_backoff_min_ms: u64,
    /// Longest retry delay.
    #[serde(default = "default_retry_backoff_max_ms")]
    pub retry_backoff_max_ms: u64,
    /// A handler running longer than this fails its attempt ("timed out") and
    /// is abandoned; 0 means no limit. Keep it below what a healthy job needs.
    #[serde(default = "default_handler_timeout_ms")]
    pub handler_timeout_ms: u64,
    /// After shutdown is asked, how long running handlers may take to finish
    /// before they are abandoned (their jobs then return by lease expiry).
    #[serde(default = "default_shutdown_grace_ms")]
    pub shutdown_grace_ms: u64,
}

/// Local servers started by `shardq local up`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalFile {
    /// Folder holding one data folder per server.
    #[serde(default = "default_local_dir")]
    pub dir: PathBuf,
    /// Port of server 0; server i listens on `base_port + i`.
    #[serde(default = "default_base_port")]
    pub base_port: u16,
    /// How many servers `shardq local up` starts by default.
    #[serde(default = "default_local_shards")]
    pub shards: usize,
}

/// Enqueue limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    /// Largest payload accepted, in bytes of JSON text.
    #[serde(default = "default_max_payload")]
    pub max_payload_bytes: usize,
    /// Attempts a job gets when it does not say (a job on its last failed
    /// attempt becomes `dead`).
    #[serde(default = "default_max_attempts")]
    pub default_max_attempts: i32,
}

/// Retention of finished jobs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionFile {
    /// Finished (succeeded, dead, cancelled) jobs older than this are deleted with their steps.
    #[serde(default = "default_retention_ms")]
    pub finished_after_ms: u64,
    /// Rows deleted per statement: bounded, so a backlog never makes one long lock-holding delete.
    #[serde(default = "default_retention_batch")]
    pub batch: i64,
    /// How often each shard is swept.
    #[serde(default = "default_retention_interval_ms")]
    pub interval_ms: u64,
}

fn default_timezone() -> String {
    "UTC".into()
}
fn default_missed() -> String {
    "skip".into()
}
fn default_slots() -> u32 {
    2
}
// Off: measured side by side on 2 cores, a fixed K = 2 kept gated at or
// above ungated where adaptive K did not (docs/benchmarks.md, "Adaptive K").
fn default_adaptive_slots() -> bool {
    false
}
fn default_slots_min() -> u32 {
    1
}
// Eight claimers on one shard still drain about as fast as two (ungated at 8
// dequeuers per shard came within 12 % of gated); the SKIP LOCKED spiral shows
// beyond (docs/benchmarks.md, "Scale-out: gated vs ungated").
fn default_slots_max() -> u32 {
    8
}
fn default_batch() -> u32 {
    500
}
fn default_empty_min() -> u64 {
    50
}
fn default_empty_max() -> u64 {
    150
}
fn default_idle_poll() -> u64 {
    3000
}
fn default_wake_cooldown() -> u64 {
    0
}
fn default_claim_budget_max() -> u64 {
    250
}
fn default_busy_min() -> u64 {
    1
}
fn default_busy_max() -> u64 {
    40
}
fn default_unhealthy_min() -> u64 {
    250
}
fn default_unhealthy_max() -> u64 {
    10_000
}
/// `database.lock_timeout_ms` when not given.
pub(super) const DEFAULT_LOCK_TIMEOUT_MS: u64 = 2_000;
/// `database.statement_timeout_ms` when not given.
pub(super) const DEFAULT_STATEMENT_TIMEOUT_MS: u64 = 10_000;
/// `database.connect_timeout_ms` when not given.
pub(super) const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 3_000;
fn default_queues() -> Vec<String> {
    vec!["default".into()]
}
fn default_concurrency() -> usize {
    16
}
fn default_producers() -> usize {
    2
}
fn default_buffer_jobs() -> usize {
    4_000
}
fn default_lease_ms() -> u64 {
    60_000
}
fn default_completion_batch() -> usize {
    1_000
}
fn default_completion_flush_ms() -> u64 {
    5
}
fn default_maintenance_interval_ms() -> u64 {
    1_000
}
fn default_retry_backoff_min_ms() -> u64 {
    1_000
}
fn default_retry_backoff_max_ms() -> u64 {
    600_000
}
fn default_max_attempts() -> i32 {
    20
}
fn default_retention_ms() -> u64 {
    24 * 3600 * 1000
}
fn default_retention_batch() -> i64 {
    10_000
}
fn default_retention_interval_ms() -> u64 {
    60_000
}
fn default_handler_timeout_ms() -> u64 {
    30 * 60 * 1000
}
fn default_shutdown_grace_ms() -> u64 {
    30_000
}
fn default_local_dir() -> PathBuf {
    PathBuf::from(".shardq/local")
}
fn default_base_port() -> u16 {
    54330
}
fn default_local_shards() -> usize {
    4
}
fn default_max_payload() -> usize {
    1 << 20
}

macro_rules! default_from_serde {
    ($($t:ty),*) => {$(
        impl Default for $t {
            fn default() -> Self {
                // Every field has a serde default, so an empty table is valid.
                serde_json::from_str("{}").expect("all fields have defaults")
            }
        }
    )*};
}
default_from_serde!(
    ConfigFile,
    DatabaseFile,
    DequeueFile,
    WorkerFile,
    LocalFile,
    LimitsFile,
    RetentionFile
);
