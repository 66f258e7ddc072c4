//! `shardq bench`: measurements that start their own PostgreSQL server, so
//! that every number comes from one invocation on one known setup.

mod ceiling;
mod fleet;
mod pgcpu;
mod pipeline;
mod procfs;
mod report;
pub mod scale;
mod server;
mod table;

use clap::{Args, Subcommand};
use std::path::PathBuf;

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// One shard, side by side: the claim+complete statement ceiling, the
    /// pipelined worker and the serial baseline (as real worker processes).
    Pipeline(PipelineArgs),
    /// Gated vs ungated dequeue on N shards with worker processes: a sweep
    /// over shards and dequeuers, a disturbance of one shard, plots.
    Scale(Box<scale::ScaleArgs>),
}

/// Flags of `shardq bench pipeline`.
#[derive(Debug, Args)]
pub struct PipelineArgs {
    /// Jobs per ceiling run and for the pipelined worker run.
    #[arg(long, default_value_t = 200_000)]
    pub jobs: usize,
    /// Jobs for the serial baseline run (smaller: it is slow).
    #[arg(long, default_value_t = 10_000)]
    pub serial_jobs: usize,
    /// When > 0, an extra pipelined run draining this many jobs, only to
    /// report the worker's peak memory (e.g. 1000000).
    #[arg(long, default_value_t = 0)]
    pub memory_jobs: usize,
    /// Where the JSON results go (folders are created).
    #[arg(long, default_value = "bench/results/pipeline.json")]
    pub out: PathBuf,
}

/// Runs one benchmark. Ctrl-C drops it, which stops its PostgreSQL server
/// (the worker subprocess gets the same SIGINT and stops by itself).
pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    let bench = async {
        match command {
            BenchCommand::Pipeline(args) => pipeline::run(args).await,
            BenchCommand::Scale(args) => scale::run(*args).await,
        }
    };
    tokio::select! {
        result = bench => result,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; the benchmark's server was stopped"),
    }
}
