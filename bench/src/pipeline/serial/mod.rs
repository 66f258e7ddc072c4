//! `shardq-bench serial-worker` (hidden): the serial baseline that
//! `shardq-bench pipeline` measures the pipelined worker against. Each of
//! `worker.concurrency` loops claims one job, runs it, and writes its
//! completion, paying two round trips per job (the foundation's worker, as
//! it was before the pipeline).
//!
//! It is built on the library's public API only (`shardq::store::jobs`,
//! `shardq::worker::Stats`), so it is a baseline of the same statements, not
//! of the worker: it runs only the built-in `noop` handler (the jobs the
//! bench enqueues; any other fails), does no lease extension, cancellation
//! polls or upkeep (a noop job holds its lease for a round trip), and stops
//! once no queued or running job is left, or at SIGINT/SIGTERM. It prints a
//! [`shardq::WorkerReport`] as JSON, as `shardq worker --json` does.

mod rotation;

use anyhow::{Context, Result};
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rotation::{Next, Rotation};
use shardq::config::Config;
use shardq::job::{ClaimedJob, Completion, Outcome};
use shardq::shards::ShardSet;
use shardq::store::jobs::{self, Claim, ClaimParams, CompleteMany};
use shardq::worker::{Stats, NOOP};
use shardq::{Client, WorkerReport};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often the worker asks the shards whether work is left (as
/// `shardq worker --until-empty` does).
const EMPTY_CHECK_INTERVAL: Duration = Duration::from_millis(200);

/// Flags of `shardq-bench serial-worker`.
#[derive(Debug, Args)]
pub struct SerialWorkerArgs {
    /// Queues to serve (repeat the flag for several; default: worker.queues).
    #[arg(long)]
    pub queue: Vec<String>,
}

/// One queue on one shard, which the loops claim from.
struct Target {
    shard: usize,
    queue: String,
}

/// What every loop of the process shares.
struct Serial {
    config: Config,
    shards: ShardSet,
    /// Shard-major, queues in order.
    targets: Vec<Target>,
    owner: String,
    stats: Arc<Stats>,
}

/// Runs the serial worker until no work is left (or a signal), then prints
/// its report.
///
/// # Errors
///
/// When the shards cannot be set up or the report cannot be written.
pub async fn run(mut config: Config, args: SerialWorkerArgs) -> Result<()> {
    if !args.queue.is_empty() {
        config.worker.queues = args.queue;
    }
    let started = Instant::now();
    let shards = ShardSet::connect(&config).context("cannot set up the shards")?;
    let targets: Vec<Target> = (0..shards.len())
        .flat_map(|shard| {
            config.worker.queues.iter().map(move |queue| Target {
                shard,
                queue: queue.clone(),
            })
        })
        .collect();
    anyhow::ensure!(!targets.is_empty(), "no shard or queue to serve");
    let serial = Arc::new(Serial {
        owner: format!(
            "serial-{}-{:08x}",
            std::process::id(),
            rand::thread_rng().gen::<u32>()
        ),
        stats: Arc::new(Stats::new(shards.len())),
        shards,
        targets,
        config,
    });
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    tokio::spawn(stop_when_empty(serial.clone(), shutdown.clone()));
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..serial.config.worker.concurrency {
        let start = rand::thread_rng().gen_range(0..serial.targets.len());
        let rotation = Rotation::new(serial.targets.len(), start, &serial.config.dequeue);
        loops.spawn(serial_loop(serial.clone(), rotation, shutdown.clone()));
    }
    while loops.join_next().await.is_some() {}
    let report = WorkerReport {
        stats: serial.stats.snapshot(),
        elapsed: started.elapsed(),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// One serial loop; returns at shutdown.
async fn serial_loop(serial: Arc<Serial>, mut rotation: Rotation, shutdown: CancellationToken) {
    let stats = &serial.stats;
    let mut rng = StdRng::from_entropy();
    while !shutdown.is_cancelled() {
        let target = match rotation.next(Instant::now()) {
            Next::Visit(t) => t,
            Next::WaitUntil(until) => {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(until.into()) => continue,
                }
            }
        };
        let Target {
            shard: shard_index,
            queue,
        } = &serial.targets[target];
        let shard = serial.shards.get(*shard_index);
        let params = ClaimParams {
            queue,
            limit: 1,
            owner: &serial.owner,
            lease: serial.config.worker.lease,
            mode: serial.config.dequeue.mode,
        };
        let started = Instant::now();
        let result = jobs::claim(shard, params).await;
        stats.record_claim(*shard_index, target, &result, started.elapsed());
        match result {
            Ok(Claim::Jobs(jobs) | Claim::HeldBack(jobs)) => {
                rotation.claimed(target);
                for job in jobs {
                    let done = execute(&job);
                    let write = CompleteMany {
                        owner: &serial.owner,
                        retry: serial.config.worker.retry_backoff,
                        done: &[done],
                    };
                    match jobs::complete_many(shard, write).await {
                        Ok(w) => {
                            stats.record_written(*shard_index, &w, []);
                        }
                        Err(err) => {
                            tracing::warn!(error = %shardq::error_chain(&err), "completion failed; the job returns when its lease expires")
                        }
                    }
                }
            }
            Ok(Claim::Busy) => {
                if let Some(pause) = rotation.busy(target, Instant::now(), &mut rng) {
                    tokio::time::sleep(pause).await;
                }
            }
            Ok(Claim::Empty) => {
                rotation.empty(target, Instant::now(), &mut rng);
            }
            Err(err) => {
                rotation.failed(target, Instant::now(), &mut rng);
                tracing::warn!(error = %shardq::error_chain(&err), "claim failed");
            }
        }
    }
}

/// Runs `job` (only the built-in noop handler) into its completion.
fn execute(job: &ClaimedJob) -> Completion {
    let outcome = if job.handler == NOOP {
        Outcome::Succeeded(serde_json::Value::Null)
    } else {
        Outcome::Failed(format!(
            "the serial baseline runs only the `{NOOP}` handler, not `{}`",
            job.handler
        ))
    };
    Completion::of(job, outcome.storable())
}

/// Cancels `shutdown` once no shard has a queued or running job of the queues.
async fn stop_when_empty(serial: Arc<Serial>, shutdown: CancellationToken) {
    let client = Client::from_shards(serial.shards.clone(), serial.config.limits.clone());
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(EMPTY_CHECK_INTERVAL) => {}
        }
        let mut pending = false;
        for queue in &serial.config.worker.queues {
            if !matches!(client.has_pending(queue).await, Ok(false)) {
                pending = true;
                break;
            }
        }
        if !pending {
            shutdown.cancel();
            return;
        }
    }
}

/// SIGINT or SIGTERM (the bench giving up): stop after the job in hand.
async fn watch_signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(handler: &str) -> ClaimedJob {
        ClaimedJob {
            id: shardq::JobId {
                shard_key: 0,
                id: 1,
            },
            shard: 0,
            queue: "q".into(),
            handler: handler.into(),
            ordering_key: None,
            payload: serde_json::Value::Null,
            attempt: 1,
            fence: 1,
            claim: 0,
            created_at: std::time::SystemTime::now(),
            held_until: tokio::time::Instant::now(),
        }
    }

    #[test]
    fn runs_noop_and_fails_any_other_handler() {
        assert!(matches!(execute(&job(NOOP)).outcome, Outcome::Succeeded(_)));
        assert!(
            matches!(execute(&job("send_mail")).outcome, Outcome::Failed(m) if m.contains("send_mail"))
        );
    }
}
