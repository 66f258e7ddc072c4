//! `shardq-bench chaos` (also `shardq chaos`): a bounded fault-injection run.
//!
//! On fresh local shards, a fleet of worker processes drains a stream of noop
//! jobs and three-step durable workflows while workers are SIGKILLed, a shard
//! crashes and restarts, connections are terminated, the queue table is locked
//! and rewritten. Afterwards every row is read back and checked: no job lost,
//! none completed twice, no recorded step applied again.
//!
//! ```text
//! setup ─> fault phase (enqueue + faults) ─> drain ─> stop workers ─> check ─> teardown
//! ```

mod cluster;
mod faults;
mod fleet;
mod inject;
mod load;
mod report;
mod sql;
mod verify;
pub mod worker;

use anyhow::{bail, Result};
use clap::Args;
use cluster::Cluster;
use fleet::Fleet;
use report::{Settings, Summary};
use shardq::shards::ShardSet;
use shardq::Client;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// Share of the fault phase over which the jobs are enqueued: the last faults
/// still hit a queue with work in flight, and the enqueuer has slack to
/// catch up after a stall.
const ENQUEUE_SHARE: f64 = 0.8;

/// How often the fleet is checked for workers that exited by themselves.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// Arguments of `shardq-bench chaos`.
#[derive(Debug, Clone, Args)]
pub struct ChaosArgs {
    /// Jobs to enqueue (one in five a three-step workflow, the rest noops).
    #[arg(long, default_value_t = 100_000)]
    pub jobs: usize,
    /// Worker processes running at any time.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Length of the fault phase, in seconds; enqueueing runs during it.
    #[arg(long, default_value_t = 60)]
    pub duration_s: u64,
    /// After the fault phase, how long the queue may take to drain.
    #[arg(long, default_value_t = 180)]
    pub drain_timeout_s: u64,
    /// Port of shard 0 (shard i on base+i); by default free ports are found.
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Keep the temporary folder (server data and logs, worker logs) afterwards.
    #[arg(long)]
    pub keep_dir: bool,
    /// Self-check: break invariants on purpose after the drain; succeed only
    /// when the checks report exactly what was broken.
    #[arg(long, hide = true)]
    pub inject_violations: bool,
}

/// Runs the chaos test; fails (exit 1) when an invariant fails.
pub async fn run(args: ChaosArgs) -> Result<()> {
    if args.workers == 0 || args.jobs == 0 {
        bail!("--workers and --jobs must be at least 1");
    }
    let shortest = faults::LONGEST_PERIOD.as_secs() * 2;
    if args.duration_s < shortest {
        bail!("--duration-s must be at least {shortest}, so that every fault fires");
    }
    let mut cluster = Cluster::start(args.base_port, args.keep_dir).await?;
    let outcome = tokio::select! {
        summary = run_on(&cluster, &args) => summary,
        () = interrupted() => Err(anyhow::anyhow!("interrupted")),
    };
    // The fleet is gone (workers stopped, or killed on drop): stop the servers.
    if let Err(err) = cluster.teardown() {
        tracing::warn!(error = format!("{err:#}"), "chaos teardown failed");
    }
    let summary = outcome?;
    summary.print();
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)?;
    }
    if args.inject_violations {
        return inject::detected(&summary);
    }
    if !summary.passed() {
        let failed = summary.invariants.iter().filter(|i| !i.pass).count();
        bail!("{failed} chaos invariant(s) failed");
    }
    Ok(())
}

/// Statement deadline of the chaos command's own connections.
const CHECK_STATEMENT_TIMEOUT: Duration = Duration::from_secs(120);

/// The run proper, on a started cluster.
async fn run_on(cluster: &Cluster, args: &ChaosArgs) -> Result<Summary> {
    // The enqueuer and the checks: the workers' 1 s statement deadline is too
    // short for the checks' scans over the whole run's rows.
    let mut own = cluster.config.clone();
    own.dequeue.statement_timeout = CHECK_STATEMENT_TIMEOUT;
    let client = Client::from_shards(ShardSet::connect(&own)?, own.limits.clone());
    let fleet = Mutex::new(Fleet::start(
        cluster.config_path.clone(),
        cluster.log_dir(),
        args.workers,
    )?);
    let phase = Duration::from_secs(args.duration_s);
    let started = Instant::now();
    let deadline = started + phase + Duration::from_secs(args.drain_timeout_s);
    tracing::info!(
        jobs = args.jobs,
        workers = args.workers,
        phase_s = args.duration_s,
        "fault phase begins"
    );

    let reaping = CancellationToken::new();
    let load = tokio::spawn(load::run(
        client.clone(),
        args.jobs,
        phase.mul_f64(ENQUEUE_SHARE),
        deadline,
    ));
    let phases = async {
        let events = faults::run(cluster, &fleet, phase).await;
        tracing::info!("fault phase over; waiting for the enqueuer and the drain");
        let load = load.await;
        let drained = match &load {
            Ok(_) => verify::drain(&client, deadline).await,
            Err(_) => None,
        };
        reaping.cancel();
        (events, load, drained)
    };
    // Workers that exit by themselves are replaced until the queue is drained.
    let ((events, load, drained), ()) = tokio::join!(phases, reap_until(&fleet, reaping.clone()));
    let load = load?;
    let end = drained.unwrap_or_else(Instant::now);
    let mut fleet = fleet.into_inner();
    fleet.stop(fleet::STOP_GRACE).await?;
    if args.inject_violations {
        inject::inject(&client, &load).await?;
    }
    let checks = verify::check(&client, &load).await?;
    let elapsed_s = end.duration_since(started).as_secs_f64();
    Ok(Summary {
        settings: Settings {
            shards: cluster::SHARDS,
            workers: args.workers,
            jobs: args.jobs,
            duration_s: args.duration_s,
            drain_timeout_s: args.drain_timeout_s,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        },
        enqueued: load.enqueued,
        workflows: load.workflows,
        failed_chunks: load.failed_chunks,
        first_enqueue_error: load.first_error,
        faults: events,
        fault_counts: Vec::new(),
        workers_started: fleet.started(),
        workers_killed: fleet.killed,
        unexpected_exits: fleet.unexpected,
        drained: drained.is_some(),
        elapsed_s,
        jobs_per_second: checks.all_succeeded as f64 / elapsed_s.max(1e-9),
        checks,
        invariants: Vec::new(),
    }
    .finish())
}

/// Replaces workers that exit by themselves, until `stop`.
async fn reap_until(fleet: &Mutex<Fleet>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(REAP_EVERY);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(err) = fleet.lock().await.reap() {
            tracing::error!(error = format!("{err:#}"), "cannot replace a worker");
        }
    }
}

/// Completes on SIGINT or SIGTERM, so that an interrupted run still stops its
/// workers and servers.
async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        // Without a SIGTERM handler, SIGTERM keeps its default (exit at once).
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        return;
    };
    tokio::select! {
        Ok(()) = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
