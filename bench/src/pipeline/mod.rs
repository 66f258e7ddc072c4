//! `shardq-bench pipeline` (also `shardq bench pipeline`): on one fresh
//! shard, the statement ceiling, the pipelined worker and the serial
//! baseline (as real worker processes), one after the other, each from the
//! same starting state.
//!
//! Roles: [`server`] (the one shard), [`ceiling`] (claim+complete statements
//! without a worker), [`fleet`] (a `shardq worker` process, or a
//! `shardq-bench serial-worker` one for the [`serial`] baseline), [`pgcpu`]
//! (the server's CPU time), [`report`] and [`table`] (results).

mod args;
mod ceiling;
mod drained;
mod fleet;
pub mod limits;
mod minimal;
pub(crate) mod pgcpu;
mod report;
pub mod serial;
mod server;
pub mod statements;
mod table;

pub use args::PipelineArgs;

use crate::procfs::{self, Clock};
use anyhow::{bail, Result};
use ceiling::Statements;
use report::{Machine, Report, Runs, Settings};
use server::BenchServer;

/// Below this many jobs a run is too short to time: start-up and the
/// worker's 200 ms empty check would dominate.
const MIN_JOBS: usize = 1_000;

/// Dequeuers of the minimal ceiling runs.
const MINIMAL_DEQUEUERS: &[usize] = &[1, 2];

/// Runs the whole benchmark, prints the table, writes the JSON.
pub async fn run(args: PipelineArgs) -> Result<()> {
    for (flag, n) in [("--jobs", args.jobs), ("--serial-jobs", args.serial_jobs)] {
        if n < MIN_JOBS {
            bail!("{flag} {n}: give at least {MIN_JOBS} jobs so the run can be timed");
        }
    }
    if args.memory_jobs > 0 && args.memory_jobs < MIN_JOBS {
        bail!(
            "--memory-jobs {}: give 0 (skip) or at least {MIN_JOBS}",
            args.memory_jobs
        );
    }
    let machine = Machine::probe();
    let settings = Settings::new(&args);
    let clock = Clock::probe();
    eprintln!(
        "shardq bench pipeline: {} cores, {:.1} GiB; starting a PostgreSQL server",
        machine.cpus,
        machine.mem_total_mib / 1024.0
    );
    let server = BenchServer::start().await?;
    if let Some(fillfactor) = args.table_fillfactor {
        server.set_table_fillfactor(fillfactor).await?;
    }
    eprintln!(
        "PostgreSQL {} with data in {}",
        server.version(),
        server.data_dir().display()
    );

    let mut ceiling_runs = Vec::with_capacity(ceiling::DEQUEUERS.len());
    for &dequeuers in ceiling::DEQUEUERS {
        eprintln!("ceiling: {} jobs, {dequeuers} dequeuer(s)", args.jobs);
        let run = ceiling::run(&server, clock, args.jobs, dequeuers, Statements::Shardq).await?;
        eprintln!("  {:.0} jobs/s", run.jobs_per_s);
        ceiling_runs.push(run);
    }
    let mut minimal_runs = Vec::new();
    for &dequeuers in MINIMAL_DEQUEUERS {
        eprintln!(
            "minimal ceiling: {} jobs, {dequeuers} dequeuer(s)",
            args.jobs
        );
        let run = ceiling::run(&server, clock, args.jobs, dequeuers, Statements::Minimal).await?;
        eprintln!("  {:.0} jobs/s", run.jobs_per_s);
        minimal_runs.push(run);
    }
    let pipeline = worker_run(&server, clock, "pipeline", args.jobs, false).await?;
    let serial = worker_run(&server, clock, "serial", args.serial_jobs, true).await?;
    let memory = if args.memory_jobs > 0 {
        Some(worker_run(&server, clock, "memory", args.memory_jobs, false).await?)
    } else {
        None
    };

    let profile = if args.profile {
        statements::start(server.shard()).await?;
        let run = worker_run(&server, clock, "profile", args.jobs, false).await?;
        Some((
            statements::finish(server.shard(), run.succeeded).await?,
            run.succeeded,
        ))
    } else {
        None
    };

    let runs = Runs {
        ceiling: ceiling_runs,
        minimal: minimal_runs,
        pipeline,
        serial,
        memory,
    };
    let report = Report::new(machine, server.version().to_string(), settings, runs)?;
    server.close().await;
    table::print(&report);
    if let Some((costs, jobs)) = &profile {
        statements::print(costs, &format!("an extra pipeline run of {jobs} jobs"));
    }
    report.write(&args.out)?;
    println!("results written to {}", args.out.display());
    report.check()
}

/// One worker-process run with progress lines.
async fn worker_run(
    server: &BenchServer,
    clock: Clock,
    label: &str,
    jobs: usize,
    serial: bool,
) -> Result<fleet::FleetRun> {
    let process = if serial {
        "`shardq-bench serial-worker`"
    } else {
        "`shardq worker`"
    };
    eprintln!("{label}: {jobs} jobs, one {process} process");
    let run = fleet::run(server, clock, label, jobs, serial).await?;
    eprintln!(
        "  {:.0} jobs/s, peak RSS {:.1} MiB",
        run.jobs_per_s, run.peak_rss_mib
    );
    Ok(run)
}

/// Cores and memory, for the header.
impl Machine {
    fn probe() -> Machine {
        Machine {
            cpus: procfs::cpus(),
            mem_total_mib: procfs::mem_total_mib().unwrap_or(0.0),
            note: format!(
                "the database, the worker and this bench process share the machine's {} cores",
                procfs::cpus()
            ),
            loadavg_at_start: procfs::loadavg(),
        }
    }
}
