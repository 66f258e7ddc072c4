//! `shardq-bench scale-worker` (hidden): one worker process of `shardq-bench scale`.
//!
//! It runs a [`shardq::Worker`] over the shards of its `--config` with the
//! `SHARDQ_*` settings the bench gives it, and talks to the bench in JSON
//! lines (see [`super::proto`]): `ready` once its pools are warm, then — after
//! `go` on stdin — a `sample` of its per-shard counters every
//! [`proto::SAMPLE_EVERY_MS`], and at exit a `final` line with its latency
//! histograms. End of stdin (the bench closing it, or dying) stops it
//! gracefully.

use super::proto::{self, Line};
use anyhow::{Context, Result};
use shardq::config::Config;
use shardq::shards::ShardSet;
use shardq::worker::Stats;
use shardq::{HandlerRegistry, Worker};
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// Pool connections opened before `ready` beyond one per producer (the
/// completer's writes, the leaser, maintenance).
const EXTRA_CONNECTIONS: usize = 2;

/// Runs the worker process.
///
/// # Errors
///
/// When the pools cannot be built or warmed, or stdout is closed.
pub async fn run(config: Config) -> Result<()> {
    let shards = ShardSet::connect(&config)?;
    let warm = (config.worker.producers + EXTRA_CONNECTIONS)
        .min(config.shards.iter().map(|s| s.pool_size).min().unwrap_or(1));
    warm_up(&shards, warm).await?;
    let (go_tx, go_rx) = oneshot::channel();
    let shutdown = CancellationToken::new();
    watch_stdin(go_tx, shutdown.clone());
    print(&Line::Ready)?;
    if go_rx.await.is_err() {
        return Ok(()); // stdin closed before `go`: the bench gave up.
    }
    let worker = Worker::new(config, shards, HandlerRegistry::with_builtins());
    let stats = worker.stats();
    let sampling = CancellationToken::new();
    let sampler = tokio::spawn(sample(stats.clone(), sampling.clone()));
    let report = worker.run(shutdown).await;
    sampling.cancel();
    sampler.await.context("the sampler panicked")??;
    let latencies = stats.latencies();
    print(&Line::Final(Box::new(proto::FinalReport {
        shards: stats.shards(),
        pickup_us: proto::to_pairs(&latencies.pickup_us),
        claim_statement_us: latencies
            .claim_statement_us
            .iter()
            .map(proto::to_pairs)
            .collect(),
        completion_lag_us: proto::to_pairs(&latencies.completion_lag_us),
        fenced: report.stats.fenced,
    })))
}

/// Opens `n` connections per shard at once and checks each, so that the
/// timed run does not pay for connecting.
async fn warm_up(shards: &ShardSet, n: usize) -> Result<()> {
    for shard in shards.all() {
        let clients = futures_util::future::try_join_all((0..n).map(|_| shard.client())).await?;
        for client in &clients {
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| shard.query_error(e))?;
        }
    }
    Ok(())
}

/// Reads stdin on a thread: the first `go` line fires `go`; end of input
/// cancels `shutdown`.
fn watch_stdin(go: oneshot::Sender<()>, shutdown: CancellationToken) {
    std::thread::spawn(move || {
        let mut go = Some(go);
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) if l.trim() == proto::GO => {
                    if let Some(tx) = go.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        shutdown.cancel();
    });
}

/// Prints the counters every [`proto::SAMPLE_EVERY_MS`] until `stop`, and once more at the end.
async fn sample(stats: Arc<Stats>, stop: CancellationToken) -> Result<()> {
    let mut tick = tokio::time::interval(Duration::from_millis(proto::SAMPLE_EVERY_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.cancelled() => true,
        };
        print(&Line::Sample {
            unix_ms: proto::unix_ms(),
            shards: stats.shards(),
        })?;
        if stopping {
            return Ok(());
        }
    }
}

/// Writes one line to stdout and flushes it.
fn print(line: &Line) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, line)?;
    out.write_all(b"\n")?;
    out.flush().context("cannot write to stdout")
}
