//! `shardq-bench`: measurements and the chaos run, each on PostgreSQL
//! servers it starts itself, so that every number comes from one invocation
//! on one known setup. `shardq bench …` and `shardq chaos …` run this binary.
//!
//! The local clusters, worker processes and binaries it uses are those of
//! `shardq-harness`, which the integration tests share.

mod chaos;
mod horizon;
mod pipeline;
mod procfs;
mod reshard;
mod scale;
mod scrape_cost;
mod sleepers;
mod workflows;

use anyhow::Result;
use clap::{Parser, Subcommand};
use shardq::config::Config;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// shardq-bench: benchmarks and fault injection for shardq.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// A shards.toml: `scale` measures on its shards instead of local servers
    /// (the worker processes get it from the bench).
    #[arg(long, global = true, env = "SHARDQ_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One shard, side by side: the claim+complete statement ceiling, the
    /// pipelined worker and the serial baseline (as real worker processes).
    Pipeline(pipeline::PipelineArgs),
    /// Gated vs ungated dequeue on N shards with worker processes: a sweep
    /// over shards and dequeuers, a disturbance of one shard, plots.
    Scale(Box<scale::ScaleArgs>),
    /// Run jobs under injected faults on fresh local shards and check nothing was lost.
    ///
    /// Kills workers, restarts a shard, kills connections, locks and rewrites the queue
    /// table; then checks that no job was lost or completed twice and that no recorded
    /// step ran again. Exits 1 when an invariant fails.
    Chaos(chaos::ChaosArgs),
    /// Throughput through an online reshard (`--from 2 --to 4`): per shard
    /// before, during and after the move, its duration, a timeline.
    Reshard(reshard::ReshardArgs),
    /// What a fleet-wide concurrency limit that is never reached costs one
    /// worker process, side by side with no limit: medians and their ratio.
    Limits(pipeline::limits::LimitsArgs),
    /// What one scrape of `shardq metrics` costs a shard with a long history
    /// (10M finished rows by default): median ms per scrape and the plan's buffers.
    ScrapeCost(scrape_cost::ScrapeCostArgs),
    /// Claims while a long transaction holds the xmin horizon: a steady
    /// offer to one worker with a REPEATABLE READ snapshot held on shard 0,
    /// beside the same run without it; per interval the rates, pickup,
    /// claim time and dead row versions.
    Horizon(horizon::HorizonArgs),
    /// Workflows that sleep durably, offered at a steady rate to one
    /// worker: how late they wake, and the database's CPU per workflow.
    Sleepers(sleepers::SleepersArgs),
    /// What workflows cost, with one worker in this process: no-op
    /// workflows of 0, 1 and 3 steps on 1 and 2 shards (workflows/s, and
    /// the database's CPU, commits and statements per workflow), send →
    /// recv latency to parked workflows, a parent gathering 100 children.
    Workflows(workflows::WorkflowsArgs),
    /// A worker process started by `chaos` (internal).
    #[command(hide = true)]
    ChaosWorker,
    /// A worker process started by `scale` (internal).
    #[command(hide = true)]
    ScaleWorker,
    /// The serial baseline's worker process, started by `pipeline` (internal).
    #[command(hide = true)]
    SerialWorker(pipeline::serial::SerialWorkerArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                "warn,shardq=info,shardq_bench=info,shardq_harness=info".into()
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    let config = cli.config.as_deref();
    match cli.command {
        Command::Pipeline(args) => until_interrupted(pipeline::run(args)).await,
        Command::Scale(args) => until_interrupted(scale::run(*args, config)).await,
        Command::Chaos(args) => chaos::run(args).await,
        Command::Reshard(args) => until_interrupted(reshard::run(args)).await,
        Command::Horizon(args) => until_interrupted(horizon::run(args)).await,
        Command::Sleepers(args) => until_interrupted(sleepers::run(args)).await,
        Command::Workflows(args) => until_interrupted(workflows::run(args)).await,
        Command::Limits(args) => until_interrupted(pipeline::limits::run(args)).await,
        Command::ScrapeCost(args) => until_interrupted(scrape_cost::run(args)).await,
        Command::ChaosWorker => chaos::worker::run(load(config)?).await,
        Command::ScaleWorker => scale::worker::run(load(config)?).await,
        Command::SerialWorker(args) => pipeline::serial::run(load(config)?, args).await,
    }
}

/// The worker processes' configuration: their `--config` and `SHARDQ_*`.
fn load(path: Option<&Path>) -> Result<Config> {
    use anyhow::Context;
    Config::load(path).context("cannot load the configuration")
}

/// Runs a benchmark; Ctrl-C drops it, which stops its PostgreSQL servers
/// (worker processes get the same SIGINT and stop by themselves).
async fn until_interrupted(bench: impl std::future::Future<Output = Result<()>>) -> Result<()> {
    tokio::select! {
        result = bench => result,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; the benchmark's servers were stopped"),
    }
}
