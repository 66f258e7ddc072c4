//! The arguments of `shardq-bench horizon` (a leaf: the report reads them
//! too).

use std::path::PathBuf;

/// Arguments of `shardq-bench horizon`.
#[derive(Debug, Clone, clap::Args)]
pub struct HorizonArgs {
    /// Shards (one server each); the snapshot is held on the first.
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    /// Jobs offered per second, over all shards.
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// Seconds before the snapshot is taken.
    #[arg(long, default_value_t = 30)]
    pub warmup_s: u64,
    /// Seconds the snapshot is held.
    #[arg(long, default_value_t = 600)]
    pub hold_s: u64,
    /// Seconds the run goes on after the snapshot ends.
    #[arg(long, default_value_t = 60)]
    pub after_s: u64,
    /// Length of one reported interval, seconds.
    #[arg(long, default_value_t = 60)]
    pub interval_s: u64,
    /// Ordering keys the jobs are spread over, in turn (0: no key). Keyed
    /// jobs are claimed by key heads, each key's jobs in order.
    #[arg(long, default_value_t = 0)]
    pub keys: u64,
    /// Groups the jobs are spread over, in turn (0: no group; not with
    /// `--keys`). Grouped jobs are claimed by turn, groups taking turns.
    #[arg(long, default_value_t = 0, conflicts_with = "keys")]
    pub groups: u64,
    /// Profile shard 0 statement by statement (pg_stat_statements, nested
    /// statements tracked) over the last this many seconds of the hold (0:
    /// no profile). Tracking every statement costs a few percent.
    #[arg(long, default_value_t = 0)]
    pub profile_s: u64,
    /// Log the plans of shard 0's statements slower than this many
    /// milliseconds, nested ones too, with their buffers (auto_explain, in
    /// the worker's sessions from its start), and copy them next to `--out`
    /// (0: none).
    #[arg(long, default_value_t = 0)]
    pub explain_slow_ms: u64,
    /// Only the run with the snapshot held (no side-by-side baseline).
    #[arg(long)]
    pub held_only: bool,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench/results/horizon.json")]
    pub out: PathBuf,
}

impl HorizonArgs {
    /// What the jobs are spread over, for the report's lines.
    pub fn spread(&self) -> String {
        match (self.keys, self.groups) {
            (0, 0) => "no key or group".to_string(),
            (k, 0) => format!("{k} key(s)"),
            (_, g) => format!("{g} group(s)"),
        }
    }
}
