//! `shardq-bench horizon`: a steady offer of no-op jobs to one `shardq
//! worker` process while another session holds the xmin horizon back (a
//! REPEATABLE READ snapshot left open, as a report query, `pg_dump` or a
//! session idle in transaction does), beside the same run without it.
//!
//! While the horizon is held, vacuum removes no dead row version, and a
//! claim that walks the dead index entries of every job claimed since pays
//! more with each minute. Reported per interval and shard: offered and
//! completed jobs per second, pickup p50/p99 (enqueue to claim, by the
//! database's clock, over a sample of the jobs), the claim statement's mean
//! time (the worker's heartbeat), dead row versions and the age of the
//! oldest transaction.
//!
//! ```text
//! per scenario (without, then with the snapshot), on fresh servers:
//! warm-up ─> snapshot held (or not) for --hold-s ─> after, --after-s
//! ```

mod args;
mod explain;
mod offer;
mod report;
mod sample;

pub use args::HorizonArgs;

use crate::pipeline::statements;
use anyhow::{bail, Context, Result};
use report::{Interval, Scenario};
use shardq::config::Config;
use shardq::shards::ShardSet;
use shardq::Client;
use shardq_harness::process::Proc;
use shardq_harness::{LocalCluster, ShardList};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Both scenarios, printed and written.
pub async fn run(args: HorizonArgs) -> Result<()> {
    if args.shards == 0 || args.rate == 0 || args.interval_s == 0 {
        bail!("--shards, --rate and --interval-s must be at least 1");
    }
    let mut scenarios = Vec::new();
    if !args.held_only {
        scenarios.push(scenario(&args, false).await?);
    }
    scenarios.push(scenario(&args, true).await?);
    report::print(&args, &scenarios);
    report::write(&args, &scenarios)?;
    println!("results written to {}", args.out.display());
    Ok(())
}

/// Settings of the worker process: the defaults a user gets, on one queue.
const WORKER_SETTINGS: &str = "\n[worker]\nqueues = [\"bench\"]\n";

/// One scenario on fresh servers.
async fn scenario(args: &HorizonArgs, held: bool) -> Result<Scenario> {
    let label = if held { "snapshot held" } else { "no snapshot" };
    eprintln!(
        "horizon: {label}, {} shard(s), {} jobs/s offered over {}",
        args.shards,
        args.rate,
        args.spread()
    );
    let cluster = LocalCluster::start("shardq-horizon", args.shards, None).await?;
    let text = ShardList::numbered((0..args.shards).map(|i| cluster.url(i))).toml(WORKER_SETTINGS);
    let config = Config::from_toml(&text).context("the horizon config is invalid")?;
    let shards = ShardSet::connect(&config)?;
    shardq::migrate::migrate_all(&shards).await?;
    if args.explain_slow_ms > 0 {
        explain::start(shards.get(0), args.explain_slow_ms).await?;
    }
    let config_path = cluster.root().path().join("shards.toml");
    std::fs::write(&config_path, &text)?;
    let mut worker = start_worker(&config_path, &cluster.root().log_dir())?;

    let client = Client::from_shards(shards.clone(), config.limits.clone());
    let stop = CancellationToken::new();
    let offered = offer::Offered::new(args.shards);
    let offer = tokio::spawn(offer::run(
        client.clone(),
        args.rate,
        args.keys,
        args.groups,
        offered.clone(),
        stop.clone(),
    ));
    let started = Instant::now();
    let hold_from = Duration::from_secs(args.warmup_s);
    let hold_until = hold_from + Duration::from_secs(args.hold_s);
    let end = hold_until + Duration::from_secs(args.after_s);
    let mut snapshot = None;
    let mut sampler = sample::Sampler::new(shards.clone(), offered);
    let mut intervals: Vec<Interval> = Vec::new();
    let profile_from = hold_until.saturating_sub(Duration::from_secs(args.profile_s));
    let mut profiling = false;
    let mut next = Duration::from_secs(args.interval_s).min(hold_from);
    let mut interval_start = Duration::ZERO;
    while started.elapsed() < end {
        let wake = next.min(end);
        tokio::time::sleep(wake.saturating_sub(started.elapsed())).await;
        let at = started.elapsed();
        if held && snapshot.is_none() && at >= hold_from && at < hold_until {
            snapshot = Some(sample::Snapshot::hold(&cluster.url(0)).await?);
            eprintln!("  {:>4.0} s: snapshot taken on s0", at.as_secs_f64());
        }
        if args.profile_s > 0 && !profiling && at >= profile_from && at < hold_until {
            statements::start(shards.get(0)).await?;
            profiling = true;
        }
        if at >= hold_until && profiling {
            profiling = false;
            let window = (at - profile_from).as_secs_f64();
            let jobs = (args.rate as f64 / args.shards as f64 * window) as u64;
            let costs = statements::finish(shards.get(0), jobs).await?;
            let what = format!("s0, {label}, the last {window:.0} s of the hold, per job offered");
            statements::print(&costs, &what);
        }
        if at >= hold_until {
            if let Some(open) = snapshot.take() {
                open.release().await;
                eprintln!("  {:>4.0} s: snapshot released", at.as_secs_f64());
            }
        }
        if let Some(status) = worker.exited()? {
            bail!(
                "the worker exited ({status}) {:.0} s into the run; its log ends:\n{}",
                at.as_secs_f64(),
                worker.log_tail()
            );
        }
        let phase = phase_of(interval_start, hold_from, hold_until, held);
        let interval = sampler.interval(at, phase).await?;
        interval_start = at;
        eprintln!("  {}", interval.line());
        intervals.push(interval);
        next = next_boundary(at, args, &[hold_from, profile_from, hold_until]);
    }
    stop.cancel();
    let offered = offer.await??;
    drop(worker);
    if args.explain_slow_ms > 0 {
        explain::keep(&cluster, &args.out, label)?;
    }
    Ok(Scenario {
        held,
        offered_total: offered,
        intervals,
    })
}

/// What the snapshot did over the interval that began at `start`. The
/// snapshot is taken, and let go, at the end of an interval (intervals end
/// at the hold's start and end), so none straddles either: the interval
/// that ends when the snapshot is taken is the warm-up's, the one that
/// ends when it is let go the hold's last.
fn phase_of(start: Duration, from: Duration, until: Duration, held: bool) -> &'static str {
    if start < from {
        "warm-up"
    } else if start < until {
        if held {
            "held"
        } else {
            "steady"
        }
    } else {
        "after"
    }
}

/// The next sample time: every interval, and at the snapshot's start and
/// end and the profile's start.
fn next_boundary(at: Duration, args: &HorizonArgs, boundaries: &[Duration]) -> Duration {
    let step = Duration::from_secs(args.interval_s);
    let regular = at + step;
    boundaries
        .iter()
        .copied()
        .filter(|&b| b > at + Duration::from_millis(500))
        .fold(regular, Duration::min)
}

/// One `shardq worker` process over `config`, logging to a file; killed
/// when dropped.
fn start_worker(config: &std::path::Path, logs: &std::path::Path) -> Result<Proc> {
    std::fs::create_dir_all(logs)?;
    let mut command = shardq_harness::exe::shardq_command(config);
    command
        .args(["worker", "--queue", "bench"])
        .stdin(std::process::Stdio::null());
    Proc::spawn(command, logs.join("worker.log"), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_interval_takes_the_phase_it_began_in() {
        let (from, until) = (Duration::from_secs(30), Duration::from_secs(630));
        let at = |ms: u64| Duration::from_millis(ms);
        // Sampled a little late, as sleeps wake: the first interval still
        // is the warm-up, the one ending at the release still held.
        assert_eq!(phase_of(at(0), from, until, true), "warm-up");
        assert_eq!(phase_of(at(30_004), from, until, true), "held");
        assert_eq!(phase_of(at(570_010), from, until, true), "held");
        assert_eq!(phase_of(at(630_003), from, until, true), "after");
        assert_eq!(phase_of(at(90_000), from, until, false), "steady");
    }
}
