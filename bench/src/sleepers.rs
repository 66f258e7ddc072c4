//! `shardq-bench sleepers`: workflows that sleep durably, offered at a
//! steady rate to one worker on one local shard, so that rate × sleep of
//! them are parked at once. Reports how late they woke (the shard's time
//! from a sleep's recorded wake time to the claim that resumed it) and the
//! database's CPU per workflow (two runs, a park and a promotion each).

use crate::pipeline::pgcpu::Sampler;
use crate::pipeline::statements;
use crate::procfs::{self, Clock};
use anyhow::{bail, Context, Result};
use shardq::{HandlerRegistry, NewJob, Shardq};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "sleepers";

/// How long the wait for the last wake-ups may grow per workflow offered.
const BACKLOG_MS_PER_WORKFLOW: u64 = 3;

/// Enqueues per second are sent in this many batches.
const BATCHES_PER_SECOND: u64 = 20;

#[derive(Debug, clap::Args)]
pub struct SleepersArgs {
    /// Workflows enqueued per second.
    #[arg(long, default_value_t = 2_000)]
    rate: u64,
    /// How long each sleeps, seconds (parked at once: rate × sleep).
    #[arg(long, default_value_t = 10)]
    sleep_s: u64,
    /// Seconds the offer lasts.
    #[arg(long, default_value_t = 20)]
    duration_s: u64,
    /// Also profile the run statement by statement (pg_stat_statements,
    /// nested statements too: costs a few percent).
    #[arg(long)]
    statements: bool,
    /// Where the JSON results go (folders are created).
    #[arg(long, default_value = "bench/results/sleepers.json")]
    out: PathBuf,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    workflows: u64,
    rate: u64,
    sleep_s: u64,
    parked_at_once: u64,
    lateness_ms_p50: f64,
    lateness_ms_p99: f64,
    lateness_ms_max: f64,
    database_cpu_us_per_workflow: f64,
    took_s: f64,
}

pub async fn run(args: SleepersArgs) -> Result<()> {
    let one = shardq_harness::one_shard(
        "sleepers-0",
        &format!("[worker]\nqueues = [\"{QUEUE}\"]\nconcurrency = 64\n"),
    )
    .await?;
    let postmaster = procfs::postmaster_pid(&one.server.server().data_dir)?;
    let shardq = Shardq::connect(one.config.clone())?;
    let sleep = Duration::from_secs(args.sleep_s);
    let mut handlers = HandlerRegistry::new();
    handlers.register("nap", move |ctx| async move {
        ctx.sleep(sleep).await?;
        Ok(serde_json::Value::Null)
    });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    if args.statements {
        statements::start(one.shards.get(0)).await?;
    }
    let pg = Sampler::start(postmaster)?;
    let began = Instant::now();

    let per_batch = (args.rate / BATCHES_PER_SECOND).max(1);
    let batches = args.duration_s * BATCHES_PER_SECOND;
    let mut tick = tokio::time::interval(Duration::from_secs(1) / BATCHES_PER_SECOND as u32);
    for _ in 0..batches {
        tick.tick().await;
        let jobs = (0..per_batch)
            .map(|_| NewJob::new(QUEUE, "nap", serde_json::json!({})))
            .collect();
        shardq.client().enqueue_many(jobs).await?;
    }
    let workflows = per_batch * batches;
    let db = one.shards.get(0).client().await?;
    // A backlog left when the offer ends drains at the host's pace: allow
    // for it (100,000 workflows get over five minutes more).
    let backlog = Duration::from_millis(BACKLOG_MS_PER_WORKFLOW * workflows);
    let deadline = Instant::now() + sleep + Duration::from_secs(120) + backlog;
    loop {
        let done: i64 = db
            .query_one(
                "SELECT count(*) FROM workflow_status WHERE status = 'succeeded'",
                &[],
            )
            .await?
            .get(0);
        if done as u64 >= workflows {
            break;
        }
        if Instant::now() > deadline {
            bail!("{done} of {workflows} workflows finished in time");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = began.elapsed();
    let cpu = pg.finish(Clock::probe()).await?;
    let profile = match args.statements {
        true => Some(statements::finish(one.shards.get(0), workflows).await?),
        false => None,
    };
    stop.cancel();
    worker.await.context("the worker panicked")?;

    let row = db
        .query_one(
            "SELECT percentile_cont(ARRAY[0.5, 0.99, 1.0]) WITHIN GROUP (ORDER BY \
                 extract(epoch FROM w.started_at - (s.output->>'wake_at')::timestamptz) * 1000) \
             FROM workflow_status w JOIN workflow_steps s \
                 ON s.shard_key = w.shard_key AND s.workflow_id = w.id \
             WHERE s.step_name = 'shardq:sleep:1'",
            &[],
        )
        .await?;
    let lateness: Vec<f64> = row.get(0);
    let report = Report {
        workflows,
        rate: args.rate,
        sleep_s: args.sleep_s,
        parked_at_once: args.rate * args.sleep_s,
        lateness_ms_p50: lateness[0],
        lateness_ms_p99: lateness[1],
        lateness_ms_max: lateness[2],
        database_cpu_us_per_workflow: cpu.total_s * 1e6 / workflows as f64,
        took_s: took.as_secs_f64(),
    };
    println!(
        "shardq bench sleepers: {} workflows at {}/s, each sleeping {} s ({} parked at once), \
         one worker, one local shard, {:.1} s",
        report.workflows, report.rate, report.sleep_s, report.parked_at_once, report.took_s
    );
    println!(
        "wake lateness (wake time to the claim that resumed it, the shard's clock): \
         p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        report.lateness_ms_p50, report.lateness_ms_p99, report.lateness_ms_max
    );
    println!(
        "database CPU: {:.1} µs per workflow (enqueue, two claims, a park, a promotion, a completion)",
        report.database_cpu_us_per_workflow
    );
    if let Some(profile) = &profile {
        statements::print(profile, "this run, per workflow");
    }
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
    println!("results: {}", args.out.display());
    Ok(())
}
