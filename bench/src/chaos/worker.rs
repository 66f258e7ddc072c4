//! `shardq-bench chaos-worker`: one worker process of the chaos fleet. It serves the
//! chaos queues with the built-in noop, a three-step durable workflow whose
//! steps log their side effects and the torture run's keyed handler, which
//! logs when each attempt starts and finishes, and the torture run's
//! waiting workflows and their children; it stops gracefully on SIGTERM.

use super::names::STOPS_ON_SIGTERM;
use super::sql;
use super::torture::{keyed, ticks, waits};
use anyhow::{Context, Result};
use shardq::config::Config;
use shardq::shards::ShardSet;
use shardq::worker::{HandlerError, HandlerResult};
use shardq::{HandlerRegistry, JobContext, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub use super::names::{QUEUE, WORKFLOW_HANDLER};

/// The workflow's durable steps, in order.
pub const STEPS: [&str; 3] = ["one", "two", "three"];

/// How often a worker checks that `shardq-bench chaos` still runs: an orphaned
/// worker (its parent killed) stops by itself instead of running forever.
const PARENT_POLL: Duration = Duration::from_millis(500);

/// Runs a worker over `config` until SIGTERM (or until its parent is gone).
///
/// # Errors
///
/// When the shard pools cannot be built.
pub async fn run(config: Config) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    // Installed before anything else, and said in the log whatever the log
    // level: until then SIGTERM kills the process, and the fleet waits for
    // this line.
    let term = signal(SignalKind::terminate()).context("cannot catch SIGTERM")?;
    let int = signal(SignalKind::interrupt()).context("cannot catch SIGINT")?;
    eprintln!("{STOPS_ON_SIGTERM}");
    let shards = ShardSet::connect(&config)?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal_or_orphan(term, int, shutdown.clone()));
    let mut worker = Worker::new(config, shards.clone(), registry(shards));
    if let Some(ahead) = skewed_scheduler()? {
        tracing::info!(
            ahead_s = ahead.num_seconds(),
            schedule = ticks::NAME,
            "this worker runs the schedule with its scheduler clock ahead"
        );
        worker = worker
            .scheduler_clock_ahead(ahead)
            .schedule(ticks::schedule())?;
    }
    let report = worker.run(shutdown).await;
    tracing::info!(report = %serde_json::to_string(&report)?, "chaos worker stopped");
    Ok(())
}

/// How far ahead this worker's scheduler clock runs, when it is the torture
/// run's skewed scheduler ([`ticks::AHEAD_ENV`] set).
fn skewed_scheduler() -> Result<Option<chrono::TimeDelta>> {
    let Ok(text) = std::env::var(ticks::AHEAD_ENV) else {
        return Ok(None);
    };
    let seconds: i64 = text
        .parse()
        .with_context(|| format!("{}={text:?} is not a number of seconds", ticks::AHEAD_ENV))?;
    Ok(Some(chrono::TimeDelta::seconds(seconds)))
}

/// The noop handler plus [`WORKFLOW_HANDLER`], [`keyed::HANDLER`],
/// [`waits::HANDLER`] and [`waits::CHILD_HANDLER`].
pub fn registry(shards: ShardSet) -> HandlerRegistry {
    let mut registry = HandlerRegistry::with_builtins();
    let for_keyed = shards.clone();
    let for_waits = shards.clone();
    let for_children = shards.clone();
    registry.register(WORKFLOW_HANDLER, move |ctx| workflow(shards.clone(), ctx));
    registry.register(keyed::HANDLER, move |ctx| {
        keyed::run(for_keyed.clone(), ctx)
    });
    registry.register(waits::HANDLER, move |ctx| {
        waits::run(for_waits.clone(), ctx)
    });
    registry.register(waits::CHILD_HANDLER, move |ctx| {
        waits::child(for_children.clone(), ctx)
    });
    registry.register(super::reshard::HANDLER, fail_once);
    registry
}

/// The reshard run's handler: sleeps `ms`, then fails the first attempt
/// when `fail_once` says so.
async fn fail_once(ctx: JobContext) -> HandlerResult {
    let ms = ctx.payload["ms"].as_u64().unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    if ctx.payload["fail_once"].as_bool() == Some(true) && ctx.attempt == 1 {
        return Err("fails its first attempt by design".into());
    }
    Ok(serde_json::Value::Null)
}

/// Three durable steps; each inserts `(job, step, attempt)` into
/// `chaos_effects` and returns its attempt, which the step record keeps. The
/// output names the attempt that finished the workflow, so a completion written
/// by an older attempt would show.
async fn workflow(shards: ShardSet, ctx: JobContext) -> HandlerResult {
    for step in STEPS {
        let shard = shards.for_key(ctx.id.shard_key).clone();
        let (id, attempt) = (ctx.id, ctx.attempt);
        let _recorded: i32 = ctx
            .step(step, || async move {
                let db = shard.client().await?;
                db.execute(
                    sql::EFFECT_INSERT,
                    &[&id.shard_key, &id.id, &step, &attempt],
                )
                .await
                .map_err(|e| shard.query_error(e))?;
                Ok::<_, HandlerError>(attempt)
            })
            .await?;
    }
    Ok(serde_json::json!({ "attempt": ctx.attempt }))
}

/// Cancels `shutdown` on SIGTERM or SIGINT, or when the parent process is gone.
async fn stop_on_signal_or_orphan(
    mut term: tokio::signal::unix::Signal,
    mut int: tokio::signal::unix::Signal,
    shutdown: CancellationToken,
) {
    let parent = nix::unistd::getppid();
    let mut poll = tokio::time::interval(PARENT_POLL);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = poll.tick() => {
                if nix::unistd::getppid() != parent {
                    tracing::warn!("shardq-bench chaos is gone; stopping");
                    break;
                }
            }
        }
    }
    shutdown.cancel();
}
