//! `shardq bench reshard --from 2 --to 4`: throughput through an online
//! reshard. Local servers (one per shard), a backlog of keyed and unkeyed
//! no-op jobs on the first list (half of them delayed past the move, so it
//! has jobs to copy), a producer enqueueing at a steady rate and
//! a worker on the old list; after a warm-up `shardq reshard` runs, a worker
//! on the new list starts once the new epoch is recorded (as an operator
//! would), and the run goes on past the move. Reported: the move's duration
//! and jobs copied, jobs finished per second per shard before, during and
//! after, a per-second timeline, and the exactly-once check (every job
//! enqueued succeeded once, none is left).

use anyhow::{bail, Context, Result};
use serde::Serialize;
use shardq::config::Config;
use shardq::reshard::{self, Options, Progress, Step};
use shardq::shards::ShardSet;
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use shardq_harness::cluster::LocalCluster;
use shardq_harness::ShardList;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

#[derive(Debug, clap::Args)]
pub struct ReshardArgs {
    /// Shards before the move.
    #[arg(long, default_value_t = 2)]
    from: usize,
    /// Shards after the move.
    #[arg(long, default_value_t = 4)]
    to: usize,
    /// Jobs on the first list before the run starts (half keyed, half
    /// delayed past the move).
    #[arg(long, default_value_t = 100_000)]
    backlog: usize,
    /// Jobs enqueued per second throughout.
    #[arg(long, default_value_t = 2_000)]
    rate: u64,
    /// Seconds before the move starts, and after it ends.
    #[arg(long, default_value_t = 10)]
    settle_s: u64,
    /// Executor slots of each worker.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Where to write the JSON results.
    #[arg(long)]
    out: Option<PathBuf>,
}

const WORKER_TOML: &str = "
[dequeue]
batch_size = 200
[worker]
queues = [\"moving\"]
";

#[derive(Debug, Serialize)]
struct Report {
    from: usize,
    to: usize,
    backlog: usize,
    rate: u64,
    enqueued: u64,
    move_seconds: f64,
    jobs_copied: u64,
    ranges: usize,
    /// Jobs finished per second on each shard: before, during, after.
    per_shard: Vec<ShardRates>,
    /// Jobs finished per second, all shards, per second of the run (0 = start).
    timeline: Vec<(i64, Vec<u64>)>,
    move_began_s: f64,
    move_ended_s: f64,
    exactly_once: bool,
}

#[derive(Debug, Serialize)]
struct ShardRates {
    shard: usize,
    before: f64,
    during: f64,
    after: f64,
}

fn toml_of(urls: &[String], extra: &str, concurrency: usize) -> String {
    ShardList::numbered(urls).pool_size(16).toml(extra) + &format!("concurrency = {concurrency}\n")
}

fn worker(config: Config, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let shards = ShardSet::connect(&config).expect("pools");
        Worker::new(config, shards, HandlerRegistry::with_builtins())
            .run(stop)
            .await;
    })
}

fn job(n: u64) -> NewJob {
    let job = NewJob::new("moving", "noop", serde_json::json!({ "n": n }));
    if n % 2 == 0 {
        job.ordering_key(format!("key-{}", n % 5_000))
    } else {
        job
    }
}

pub async fn run(args: ReshardArgs) -> Result<()> {
    if args.from == args.to || args.from == 0 || args.to == 0 {
        bail!("--from and --to: two different shard counts, at least 1");
    }
    let servers = args.from.max(args.to);
    let cluster = LocalCluster::start("shardq-bench-reshard", servers, None).await?;
    let urls: Vec<String> = (0..servers).map(|i| cluster.url(i)).collect();
    let old = Config::from_toml(&toml_of(&urls[..args.from], WORKER_TOML, args.concurrency))?;
    let new = Config::from_toml(&toml_of(&urls[..args.to], WORKER_TOML, args.concurrency))?;
    let longer = if args.to > args.from {
        new.clone()
    } else {
        old.clone()
    };
    shardq::migrate::migrate_all(&ShardSet::connect(&old)?).await?;
    let all = ShardSet::connect(&longer)?;
    for shard in &all.all()[args.from..] {
        shardq::migrate::migrate_joining(shard, args.to).await?;
    }

    let client = Client::new(&longer)?;
    let enqueued = Arc::new(AtomicU64::new(0));
    let mut next = 0u64;
    // Half the backlog delayed past the move, so the move has jobs to copy.
    let delay = Duration::from_secs(2 * args.settle_s + 5);
    while (next as usize) < args.backlog {
        let batch: Vec<NewJob> = (next..(next + 5_000).min(args.backlog as u64))
            .map(|n| {
                if n % 4 < 2 {
                    job(n).delay(delay)
                } else {
                    job(n)
                }
            })
            .collect();
        next += batch.len() as u64;
        client.enqueue_many(batch).await.context("backlog")?;
    }
    enqueued.store(next, Ordering::Relaxed);
    println!("backlog: {next} jobs on {} shards", args.from);

    let started = Instant::now();
    let stop = CancellationToken::new();
    let old_worker = worker(old.clone(), stop.clone());
    let producer_stop = CancellationToken::new();
    let producing = {
        let (client, enqueued, stop) = (client.clone(), enqueued.clone(), producer_stop.clone());
        let per_tick = (args.rate / 20).max(1);
        tokio::spawn(async move {
            let mut n = next;
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            while !stop.is_cancelled() {
                tick.tick().await;
                let batch: Vec<NewJob> = (n..n + per_tick).map(job).collect();
                n += per_tick;
                client.enqueue_many(batch).await.expect("enqueue");
                enqueued.store(n, Ordering::Relaxed);
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(args.settle_s)).await;

    let move_began = started.elapsed();
    let (recorded_tx, recorded_rx) = tokio::sync::oneshot::channel();
    let new_worker = {
        let (new, stop) = (new.clone(), stop.clone());
        tokio::spawn(async move {
            if recorded_rx.await.is_ok() {
                worker(new, stop).await.expect("new worker");
            }
        })
    };
    let mut recorded_tx = Some(recorded_tx);
    let summary = reshard::reshard(&all, args.from, args.to, &Options::default(), |p| {
        match &p {
            Progress::Done(Step::Recorded) => {
                if let Some(tx) = recorded_tx.take() {
                    let _ = tx.send(());
                }
            }
            Progress::Pass { .. } | Progress::Planned { .. } | Progress::Retrying { .. } => {}
            Progress::Done(_) => {}
        }
        println!("  {:>6.2}s {p:?}", started.elapsed().as_secs_f64());
    })
    .await?;
    let move_ended = started.elapsed();
    println!(
        "moved: {} ranges, {} jobs copied, in {:.2} s",
        summary.ranges,
        summary.moved,
        (move_ended - move_began).as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(args.settle_s)).await;
    let run_ended = started.elapsed();
    // Stop producing (between batches); let the workers finish the rest.
    producer_stop.cancel();
    producing.await?;
    let total = enqueued.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(300);
    while unfinished(&all).await? > 0 {
        if Instant::now() > deadline {
            bail!("jobs still unfinished 300 s after the producer stopped");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.cancel();
    old_worker.await?;
    new_worker.await?;

    let epoch_start = SystemTime::now()
        .duration_since(UNIX_EPOCH)?
        .saturating_sub(started.elapsed());
    let (per_second, succeeded) = finished_per_second(&all, epoch_start).await?;
    let rate = |shard: usize, from: Duration, to: Duration| {
        let (a, b) = (from.as_secs() as i64, to.as_secs() as i64);
        let n: u64 = per_second
            .range(a..b.max(a + 1))
            .map(|(_, v)| v.get(shard).copied().unwrap_or(0))
            .sum();
        n as f64 / (b - a).max(1) as f64
    };
    let per_shard = (0..all.len())
        .map(|s| ShardRates {
            shard: s,
            before: rate(s, Duration::ZERO, move_began),
            during: rate(s, move_began, move_ended),
            after: rate(s, move_ended, run_ended),
        })
        .collect::<Vec<_>>();
    let report = Report {
        from: args.from,
        to: args.to,
        backlog: args.backlog,
        rate: args.rate,
        enqueued: total,
        move_seconds: (move_ended - move_began).as_secs_f64(),
        jobs_copied: summary.moved,
        ranges: summary.ranges,
        per_shard,
        timeline: per_second.into_iter().collect(),
        move_began_s: move_began.as_secs_f64(),
        move_ended_s: move_ended.as_secs_f64(),
        exactly_once: succeeded == total,
    };
    print_report(&report);
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", out.display()))?;
    }
    if !report.exactly_once {
        bail!("{succeeded} jobs succeeded of {total} enqueued");
    }
    Ok(())
}

async fn unfinished(shards: &ShardSet) -> Result<i64> {
    let mut n = 0;
    for shard in shards.all() {
        let row = shard
            .client()
            .await?
            .query_one(
                "SELECT count(*) FROM workflow_status WHERE status NOT IN ('succeeded', 'dead')",
                &[],
            )
            .await?;
        n += row.get::<_, i64>(0);
    }
    Ok(n)
}

/// Jobs finished per second of the run, per shard, and how many succeeded
/// in all (each job once: the primary key is unique per shard, and a job
/// lives on one shard at a time).
async fn finished_per_second(
    shards: &ShardSet,
    start: Duration,
) -> Result<(BTreeMap<i64, Vec<u64>>, u64)> {
    let mut per_second: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    let mut succeeded = 0;
    let start_s = start.as_secs_f64();
    for shard in shards.all() {
        let rows = shard
            .client()
            .await?
            .query(
                "SELECT floor(extract(epoch FROM finished_at)::float8 - $1::float8)::bigint AS s, \
                 count(*) AS n \
                 FROM workflow_status WHERE status = 'succeeded' GROUP BY 1",
                &[&start_s],
            )
            .await?;
        for r in rows {
            let (s, n): (i64, i64) = (r.get("s"), r.get("n"));
            let slot = per_second.entry(s).or_insert_with(|| vec![0; shards.len()]);
            slot[shard.index] += n as u64;
            succeeded += n as u64;
        }
    }
    Ok((per_second, succeeded))
}

fn print_report(r: &Report) {
    println!();
    println!(
        "reshard {} -> {}: {} jobs enqueued ({} backlog, then {}/s); move {:.2} s ({} ranges, {} jobs copied); exactly once: {}",
        r.from, r.to, r.enqueued, r.backlog, r.rate, r.move_seconds, r.ranges, r.jobs_copied, r.exactly_once
    );
    println!("jobs finished per second, per shard:");
    println!("  shard   before   during    after");
    for s in &r.per_shard {
        println!(
            "  {:>5} {:>8.0} {:>8.0} {:>8.0}",
            s.shard, s.before, s.during, s.after
        );
    }
    let sum = |f: fn(&ShardRates) -> f64| r.per_shard.iter().map(f).sum::<f64>();
    println!(
        "  total {:>8.0} {:>8.0} {:>8.0}",
        sum(|s| s.before),
        sum(|s| s.during),
        sum(|s| s.after)
    );
    println!(
        "timeline (second: per shard), move {:.1}..{:.1} s:",
        r.move_began_s, r.move_ended_s
    );
    for (s, v) in &r.timeline {
        println!("  {s:>4}: {v:?}");
    }
}
