//! `bench limits`: what a fleet-wide concurrency limit costs a worker that
//! never reaches it. One shard, one `shardq worker` process draining no-op
//! jobs, side by side in one invocation: no limit, then the queue limited
//! far above what the process can run (its permits leased from the shard
//! as it claims), alternating, each `--rounds` times; medians and their
//! ratio, and the database CPU per job of each; and the same jobs spread
//! over `--groups` groups (claims taking turns among them), and over
//! `--keys` ordering keys (each key's jobs in order). Then one run
//! with a rate limit: the rate it kept and the database CPU per started job;
//! and the same jobs offered at that rate (enqueued as the run goes), with
//! no limit and under the rate: what the rate itself costs at that offer.

use super::fleet::{self, FleetRun};
use super::server::{BenchServer, Spread, QUEUE};
use super::statements;
use crate::procfs::Clock;
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct LimitsArgs {
    /// Jobs per run.
    #[arg(long, default_value_t = 100_000)]
    pub jobs: usize,
    /// Runs of each kind, alternating.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// The limit of the limited runs: far above the worker's slots.
    #[arg(long, default_value_t = 1_000_000)]
    pub concurrency: u32,
    /// The rate of the rate run, jobs per second.
    #[arg(long, default_value_t = 2_000)]
    pub rate: u32,
    /// Jobs of the rate run (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    pub rate_jobs: usize,
    /// Groups the jobs of the grouped runs are spread over (0 skips them).
    #[arg(long, default_value_t = 10_000)]
    pub groups: usize,
    /// Ordering keys the jobs of the keyed runs are spread over (0 skips
    /// them).
    #[arg(long, default_value_t = 0)]
    pub keys: usize,
    /// Also profile an extra run without groups, one in groups and (with
    /// `--keys`) one over keys,
    /// statement by statement (pg_stat_statements, nested statements
    /// tracked).
    #[arg(long)]
    pub profile: bool,
    /// Where the JSON results go (folders are created).
    #[arg(long, default_value = "bench/results/limits.json")]
    pub out: PathBuf,
}

#[derive(Debug, serde::Serialize)]
struct Results {
    jobs: usize,
    concurrency: u32,
    unlimited: Vec<FleetRun>,
    limited: Vec<FleetRun>,
    median_unlimited_jobs_per_s: f64,
    median_limited_jobs_per_s: f64,
    ratio: f64,
    rate: u32,
    rated: Option<FleetRun>,
    /// The rate's jobs offered at the rate, without a limit and with it.
    offered: Vec<FleetRun>,
    groups: usize,
    grouped: Vec<FleetRun>,
    median_grouped_jobs_per_s: Option<f64>,
    keys: usize,
    keyed: Vec<FleetRun>,
    median_keyed_jobs_per_s: Option<f64>,
}

pub async fn run(args: LimitsArgs) -> Result<()> {
    if args.jobs < 1_000 || args.rounds == 0 {
        bail!("give --jobs 1000 or more and --rounds 1 or more");
    }
    let clock = Clock::probe();
    let server = BenchServer::start().await?;
    eprintln!(
        "shardq bench limits: PostgreSQL {}, {} jobs per run, {} rounds",
        server.version(),
        args.jobs,
        args.rounds
    );
    let (mut unlimited, mut limited) = (Vec::new(), Vec::new());
    let (mut grouped, mut keyed) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        let no_limit = shardq::client::QueueLimits::default();
        server.client().set_queue_limits(QUEUE, no_limit).await?;
        let run = fleet::run(&server, clock, "unlimited", args.jobs, false).await?;
        print_run(round, &run);
        unlimited.push(run);
        server
            .client()
            .set_queue_limits(
                QUEUE,
                shardq::client::QueueLimits {
                    concurrency: Some(args.concurrency),
                    ..Default::default()
                },
            )
            .await?;
        let run = fleet::run(&server, clock, "limited", args.jobs, false).await?;
        print_run(round, &run);
        limited.push(run);
        if args.groups > 0 {
            server.client().set_queue_limits(QUEUE, no_limit).await?;
            let spread = Spread::Groups(args.groups);
            let run = fleet::run_spread(&server, clock, "groups", args.jobs, spread).await?;
            print_run(round, &run);
            grouped.push(run);
        }
        if args.keys > 0 {
            server.client().set_queue_limits(QUEUE, no_limit).await?;
            let spread = Spread::Keys(args.keys);
            let run = fleet::run_spread(&server, clock, "keys", args.jobs, spread).await?;
            print_run(round, &run);
            keyed.push(run);
        }
    }
    let rated = if args.rate_jobs == 0 {
        None
    } else {
        let limits = shardq::client::QueueLimits {
            rate: Some(shardq::client::StartRate {
                count: args.rate,
                per: std::time::Duration::from_secs(1),
            }),
            ..Default::default()
        };
        server.client().set_queue_limits(QUEUE, limits).await?;
        let run = fleet::run(&server, clock, "rate", args.rate_jobs, false).await?;
        print_run(1, &run);
        Some(run)
    };
    // The same offer with and without the rate: jobs enqueued at the rate
    // while one worker runs, so both pay for small claims alike and the
    // difference is what the rate itself costs.
    let offered = if args.rate_jobs == 0 {
        Vec::new()
    } else {
        let mut runs = Vec::new();
        for (label, rate) in [("offered", None), ("offered+rate", Some(args.rate))] {
            let limits = shardq::client::QueueLimits {
                rate: rate.map(|count| shardq::client::StartRate {
                    count,
                    per: std::time::Duration::from_secs(1),
                }),
                ..Default::default()
            };
            server.client().set_queue_limits(QUEUE, limits).await?;
            let run = fleet::run_offered(&server, clock, label, args.rate_jobs, args.rate).await?;
            print_run(1, &run);
            runs.push(run);
        }
        let per_job = |run: &FleetRun| 1e6 * run.postgres_cpu.total_s / run.succeeded.max(1) as f64;
        println!(
            "offered {} jobs/s: {:.1} µs database CPU per job without a limit, {:.1} µs under \
             a rate of {} jobs/s ({:.2}x)",
            args.rate,
            per_job(&runs[0]),
            per_job(&runs[1]),
            args.rate,
            per_job(&runs[1]) / per_job(&runs[0])
        );
        runs
    };
    // Profiles: an extra run without groups, then one in groups.
    let mut profiles = Vec::new();
    if args.profile {
        server
            .client()
            .set_queue_limits(QUEUE, Default::default())
            .await?;
        let mut spreads = vec![Spread::Nothing];
        if args.groups > 0 {
            spreads.push(Spread::Groups(args.groups));
        }
        if args.keys > 0 {
            spreads.push(Spread::Keys(args.keys));
        }
        for spread in spreads {
            statements::start(server.shard()).await?;
            let run = fleet::run_spread(&server, clock, "profile", args.jobs, spread).await?;
            let costs = statements::finish(server.shard(), run.succeeded).await?;
            profiles.push((spread, costs, run.succeeded));
        }
    }
    server.close().await;
    for (spread, costs, jobs) in &profiles {
        let over = match spread {
            Spread::Nothing => "without groups or keys".to_string(),
            Spread::Groups(n) => format!("in {n} groups"),
            Spread::Keys(n) => format!("over {n} ordering keys"),
        };
        statements::print(costs, &format!("an extra run of {jobs} jobs {over}"));
    }
    let median = |runs: &[FleetRun]| {
        let mut v: Vec<f64> = runs.iter().map(|r| r.jobs_per_s).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (u, l) = (median(&unlimited), median(&limited));
    println!(
        "median jobs/s: no limit {u:.0}, limit {} {l:.0}: {:.1} % of no limit",
        args.concurrency,
        100.0 * l / u
    );
    let g = (!grouped.is_empty()).then(|| median(&grouped));
    if let Some(g) = g {
        println!(
            "median jobs/s in {} groups (claims taking turns): {g:.0}: {:.1} % of no group",
            args.groups,
            100.0 * g / u
        );
    }
    let k = (!keyed.is_empty()).then(|| median(&keyed));
    if let Some(k) = k {
        println!(
            "median jobs/s over {} keys: {k:.0}: {:.1} % of no key",
            args.keys,
            100.0 * k / u
        );
    }
    let results = Results {
        jobs: args.jobs,
        concurrency: args.concurrency,
        unlimited,
        limited,
        median_unlimited_jobs_per_s: u,
        median_limited_jobs_per_s: l,
        ratio: l / u,
        rate: args.rate,
        rated,
        offered,
        groups: args.groups,
        grouped,
        median_grouped_jobs_per_s: g,
        keys: args.keys,
        keyed,
        median_keyed_jobs_per_s: k,
    };
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&results)?)?;
    println!("results: {}", args.out.display());
    Ok(())
}

fn print_run(round: usize, run: &FleetRun) {
    let per_job_us = 1e6 * run.postgres_cpu.total_s / run.succeeded.max(1) as f64;
    println!(
        "round {round} {:>9}: {:>8.0} jobs/s, {:.1} µs database CPU per job",
        run.label, run.jobs_per_s, per_job_us
    );
}
