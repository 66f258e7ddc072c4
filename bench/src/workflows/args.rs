//! Flags of `shardq-bench workflows`.

use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// One measurement of `shardq-bench workflows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// No-op workflows of 0, 1 and 3 steps drained by one worker.
    Throughput,
    /// Messages sent to workflows parked in a `recv`: send to recv latency.
    Messages,
    /// A parent starting children and gathering their results.
    Children,
    /// Workflows sending to workflows (`ctx.send`) on the same shard and
    /// on another: latency and cost per message (two shards).
    Sends,
    /// Sends to two destinations while one is frozen: the healthy one's
    /// arrival rate before and during the freeze (three shards; not run
    /// by default).
    FrozenSends,
}

/// Flags of `shardq-bench workflows`.
#[derive(Debug, Args)]
pub struct WorkflowsArgs {
    /// The parts to run, comma-separated (all by default).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Part::Throughput, Part::Messages, Part::Sends, Part::Children])]
    pub only: Vec<Part>,
    /// Throughput: workflows drained per run.
    #[arg(long, default_value_t = 20_000)]
    pub workflows: usize,
    /// Throughput: the step counts, one run each (each step a no-op closure).
    #[arg(long, value_delimiter = ',', default_values_t = [0, 1, 3])]
    pub steps: Vec<usize>,
    /// Throughput: the shard counts, each on its own servers.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2])]
    pub shards: Vec<usize>,
    /// Messages: workflows parked in a `recv`, one message each.
    #[arg(long, default_value_t = 2_000)]
    pub messages: usize,
    /// Messages: sends per second (one at a time, evenly spaced).
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
    /// Frozen sends: how long the frozen destination stays frozen, s.
    #[arg(long, default_value_t = 30)]
    pub freeze_s: u64,
    /// Frozen sends: the worker with a buffer of 200 jobs and claims of 50
    /// (the torture run's), not the defaults.
    #[arg(long)]
    pub small_buffers: bool,
    /// Children: children per parent.
    #[arg(long, default_value_t = 100)]
    pub children: usize,
    /// Children: how long each child's handler waits (in memory, holding
    /// its slot) before it succeeds, ms; with 0 the children mostly finish
    /// before their parent awaits them, with more the parent parks on them.
    #[arg(long, default_value_t = 0)]
    pub child_work_ms: u64,
    /// Children: parents run one after the other.
    #[arg(long, default_value_t = 5)]
    pub gathers: usize,
    /// Children: on how many shards, one run each (with more than one,
    /// keyed children spread over them: most live on another shard than
    /// their parent).
    #[arg(long, value_delimiter = ',', default_values_t = [1])]
    pub children_shards: Vec<usize>,
    /// Children: each child gets a key of its own (routed by it), as they
    /// must to live on other shards; without, they take the parent's shard.
    #[arg(long)]
    pub keyed_children: bool,
    /// Small sizes for a check that the benchmark runs (seconds, not
    /// minutes): overrides the sizes above.
    #[arg(long)]
    pub quick: bool,
    /// Also profile each part on one shard statement by statement
    /// (pg_stat_statements, nested statements too: costs a few percent).
    #[arg(long)]
    pub statements: bool,
    /// Where the JSON results go (folders are created).
    #[arg(long, default_value = "bench/results/workflows.json")]
    pub out: PathBuf,
}

impl WorkflowsArgs {
    /// The sizes `--quick` runs with.
    pub fn quick_sizes(mut self) -> WorkflowsArgs {
        if self.quick {
            self.workflows = 300;
            self.shards = vec![1];
            self.messages = 40;
            self.rate = 100;
            self.children = 10;
            self.gathers = 2;
            self.freeze_s = 5;
        }
        self
    }
}
