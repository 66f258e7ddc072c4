//! `shardq-bench scale` (also `shardq bench scale`): gated vs ungated dequeue on N PostgreSQL shards with
//! a fleet of real worker processes — a sweep over shard counts and
//! dequeuers per shard, and a disturbance of one shard — with latency
//! percentiles, a per-second timeline, plots, and an exactly-once check of
//! every run.
//!
//! Roles: [`plan`] (which runs), [`cluster`] (the shards), [`load`] (the
//! enqueuer), [`fleet`] and [`worker`] (the worker processes and what they
//! report), [`timeline`]/[`measure`]/[`analyze`] (measurement),
//! [`disturb`], [`verify`], [`output`]/[`table`]/[`claims`] (report), [`plots`].

mod analyze;
mod args;
mod claims;
mod cluster;
mod disturb;
mod fleet;
mod info;
mod load;
mod measure;
mod mode;
mod output;
mod plan;
mod plot_style;
mod plot_timeline;
mod plots;
mod progress;
mod proto;
mod raw;
mod result;
mod runner;
mod stall;
mod table;
mod timeline;
mod toml_text;
mod verify;
pub mod worker;

pub use args::ScaleArgs;

use anyhow::{bail, Result};
use cluster::Cluster;
use output::{Report, Shared};
use std::path::Path;
use std::time::{Duration, Instant};

/// Runs the benchmark: every run, then the table, the files and the plots.
/// Fails (non-zero exit) when a run failed or its exactly-once check did.
pub async fn run(args: ScaleArgs, config: Option<&Path>) -> Result<()> {
    let started = Instant::now();
    let started_unix_s = proto::unix_ms() / 1e3;
    let (runs, needed) = plan::build(&args)?;
    let mut machine = info::Machine::probe();
    let mut cluster = match (config, args.local) {
        (Some(_), Some(_)) => bail!("give --local N or --config FILE, not both"),
        (Some(path), None) => Cluster::from_config(path)?,
        (None, local) => {
            let n = local.unwrap_or(needed).max(needed);
            eprintln!("starting {n} local PostgreSQL servers");
            Cluster::local(n).await?
        }
    };
    cluster.keep(args.keep);
    cluster.set_database(&args.db_set).await?;
    let shards_source = match config {
        Some(path) => format!("{} shard(s) of {}", cluster.len(), path.display()),
        None => format!(
            "{} local servers with data under {}",
            cluster.len(),
            cluster.root().display()
        ),
    };
    let servers = info::servers(&cluster).await?;
    let settings = raw::Settings {
        slots: args.slots,
        adaptive_slots: args.adaptive_slots,
        batch: args.batch,
        lock_timeout_ms: args.lock_timeout_ms,
        unhealthy_backoff_max_ms: args.unhealthy_backoff_max_ms,
        timeout: Duration::from_secs_f64(args.timeout),
        buffer_jobs: args.buffer_jobs,
        job_ms: args.job_ms,
        worker_defaults: args.worker_defaults,
    };
    let progress = progress::Progress::new(runs.len());
    let mut results = Vec::with_capacity(runs.len());
    for spec in &runs {
        let what = format!(
            "#{} {} {} {} shard(s) {} dequeuers",
            spec.id,
            spec.kind,
            spec.mode.name(),
            spec.shards,
            spec.dequeuers_per_shard
        );
        progress.start(&what);
        let report = |done, total| progress.jobs(&what, done, total);
        let result = runner::run(&cluster, spec, &settings, &report).await;
        if let Some(e) = &result.error {
            progress.clear();
            eprintln!("run {} failed: {e}", spec.id);
        }
        progress.finished();
        results.push(result);
    }
    progress.clear();
    cluster.teardown()?;
    machine.loadavg_end = crate::procfs::loadavg();
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started_unix_s,
        duration_s: started.elapsed().as_secs_f64(),
        machine,
        servers,
        settings: Shared {
            shards_source,
            slots: args.slots,
            adaptive_slots: args.adaptive_slots,
            batch: args.batch,
            processes: args.processes,
            lock_timeout_ms: args.lock_timeout_ms,
            unhealthy_backoff_max_ms: args.unhealthy_backoff_max_ms,
            buffer_jobs: args.buffer_jobs,
            job_ms: args.job_ms,
            worker_defaults: args.worker_defaults,
            repeat: args.repeat,
            sample_every_ms: proto::SAMPLE_EVERY_MS,
            warmup_s: plan::WARMUP_S,
            db_set: args.db_set.clone(),
        },
        claims: claims::judge(&results),
        runs: results,
    };
    table::print(&report);
    let csv = report.write(&args.out)?;
    let dir = args.out.parent().unwrap_or(std::path::Path::new("."));
    let plots = plots::draw(&report.runs, dir)?;
    println!();
    println!("results: {} and {}", args.out.display(), csv.display());
    for p in plots {
        println!("plot: {}", p.display());
    }
    let failed: Vec<String> = report
        .runs
        .iter()
        .filter(|r| !r.ok)
        .map(|r| r.id.to_string())
        .collect();
    if !failed.is_empty() {
        bail!("run(s) {} failed (see the table)", failed.join(", "));
    }
    Ok(())
}
