//! `shardq worker`.

use crate::args::WorkerArgs;
use anyhow::{bail, Context, Result};
use shardq::config::Config;
use shardq::migrate::{self, MigrateError};
use shardq::shards::ShardSet;
use shardq::{HandlerRegistry, Worker, WorkerReport};
use std::net::SocketAddr;
use tokio_util::sync::CancellationToken;

pub async fn run(mut config: Config, args: WorkerArgs) -> Result<()> {
    if !args.queue.is_empty() {
        config.worker.queues = args.queue.clone();
    }
    if let Some(c) = args.concurrency {
        if c == 0 {
            bail!("--concurrency must be at least 1");
        }
        config.worker.concurrency = c;
    }
    let report = run_worker(config, args.until_empty, args.metrics_addr).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

/// Checks the schema, runs a worker until a signal (or until empty), serving
/// its metrics at `metrics_addr` while it runs; returns its report.
pub async fn run_worker(
    config: Config,
    until_empty: bool,
    metrics_addr: Option<SocketAddr>,
) -> Result<WorkerReport> {
    // Signals are caught from the start: a SIGTERM while the schema check
    // waits on a slow shard stops the worker cleanly instead of killing it.
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(Signals::install()?, shutdown.clone()));
    let shards = ShardSet::connect(&config)?;
    tokio::select! {
        checked = check_schema(&shards) => checked?,
        // Told to stop before it started: the worker below ends at once.
        _ = shutdown.cancelled() => {}
    }
    // `shardq worker` runs the built-in `noop` and `sleep` handlers (what
    // `shardq demo`, `shardq enqueue` and the benchmarks enqueue); an
    // embedder's `HandlerRegistry::new()` starts empty.
    let handlers = HandlerRegistry::with_builtins();
    let worker = Worker::new(config, shards, handlers).stop_when_empty(until_empty);
    let serving = CancellationToken::new();
    if let Some(addr) = metrics_addr {
        let metrics = worker.metrics();
        let render = move || std::future::ready(metrics.encode());
        shardq::prometheus::serve(addr, render, serving.clone())
            .await
            .with_context(|| format!("cannot listen for metrics on {addr}"))?;
    }
    let report = worker.run(shutdown).await;
    serving.cancel();
    Ok(report)
}

/// Refuses to run against a schema of another version; an unreachable shard
/// only warns, since the worker retries it.
pub(crate) async fn check_schema(shards: &ShardSet) -> Result<()> {
    for shard in shards.all() {
        match migrate::check_shard(shard, shards.len()).await {
            Ok(()) => {}
            Err(MigrateError::Shard(err)) => tracing::warn!(
                shard = %shard.name,
                error = %shardq::error_chain(&err),
                "shard unreachable at start; will keep retrying it"
            ),
            Err(err) => return Err(err.into()),
        }
    }
    // The scheduler's enqueues route by the shards' map; one that cannot
    // be read yet is loaded by the first enqueue that needs it.
    if let Err(err) = shards.load_map().await {
        tracing::warn!(error = %shardq::error_chain(&err), "cannot load the shard map at start");
    }
    Ok(())
}

/// SIGTERM and SIGINT, caught (their default action, exiting, is off from
/// the moment these exist).
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("cannot catch SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot catch SIGINT")?,
        })
    }
}

/// First SIGINT/SIGTERM: graceful shutdown. Second: exit at once (claimed jobs
/// come back when their leases expire).
async fn watch_signals(mut signals: Signals, shutdown: CancellationToken) {
    for round in 0..2 {
        tokio::select! {
            _ = signals.term.recv() => {}
            _ = signals.int.recv() => {}
        }
        if round == 0 {
            tracing::info!("shutting down: no new claims, finishing running jobs");
            shutdown.cancel();
        } else {
            tracing::warn!("second signal: exiting now");
            std::process::exit(130);
        }
    }
}

pub fn print_report(report: &WorkerReport) {
    let s = &report.stats;
    println!(
        "finished {} jobs ({} succeeded, {} retrying, {} dead, {} cancelled) in {:.2} s: {:.0} jobs/s",
        s.finished(),
        s.succeeded,
        s.retrying,
        s.dead,
        s.cancelled,
        report.elapsed.as_secs_f64(),
        report.jobs_per_second()
    );
    println!(
        "claims: {} statements, {} busy, {} empty, {} errors; completion statements: {}; fenced: {}; recovered: {}; released: {}",
        s.claim_statements, s.busy, s.empty, s.claim_errors, s.completion_statements, s.fenced, s.recovered, s.released
    );
}
