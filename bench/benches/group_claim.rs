//! What do groups cost a claim? Times one claim statement of 64 jobs on one
//! fresh local shard holding 20,000 ready jobs laid out as: no group, one
//! group, 100 groups, 10,000 groups, and 10,000 groups under a group
//! concurrency limit (each group's lock tried and its running jobs counted;
//! none held back). Setups alternate round by round so machine drift
//! favours none; medians are printed side by side.
//!
//! Run: `cargo bench -p shardq-bench --bench group_claim` (or `-- --rounds 7`).

#[path = "support.rs"]
mod support;
use anyhow::Result;
use shardq::client::QueueLimits;
use shardq::config::DequeueMode;
use shardq::store::jobs::{self, Claim, ClaimParams};
use shardq::{Client, NewJob};
use std::time::{Duration, Instant};
use support::{flag, one_shard};

const DEFAULT_ROUNDS: usize = 5;
const READY: usize = 20_000;
const BATCH: u32 = 64;
/// Claims timed per setup and round (each takes a batch: 1,280 of 20,000).
const CLAIMS: usize = 20;

struct Setup {
    label: &'static str,
    /// Groups the ready jobs are spread over; 0: no group.
    groups: usize,
    group_concurrency: Option<u32>,
}

const SETUPS: &[Setup] = &[
    Setup {
        label: "no group",
        groups: 0,
        group_concurrency: None,
    },
    Setup {
        label: "1 group",
        groups: 1,
        group_concurrency: None,
    },
    Setup {
        label: "100 groups",
        groups: 100,
        group_concurrency: None,
    },
    Setup {
        label: "10,000 groups",
        groups: 10_000,
        group_concurrency: None,
    },
    Setup {
        label: "10,000 groups, limit 1,000 each",
        groups: 10_000,
        group_concurrency: Some(1_000),
    },
];

fn jobs(groups: usize) -> Vec<NewJob> {
    (0..READY)
        .map(|i| {
            let job = NewJob::new("bench", "noop", serde_json::json!({}));
            match groups {
                0 => job,
                n => job.group(format!("tenant-{}", i % n)),
            }
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<()> {
    let rounds = flag(
        &std::env::args().collect::<Vec<_>>(),
        "--rounds",
        DEFAULT_ROUNDS,
    )?;
    let (server, config, shards) = one_shard("").await?;
    let client = Client::from_shards(shards.clone(), config.limits.clone());
    let shard = shards.get(0);
    let db = shard.client().await?;
    println!(
        "group claim benchmark: {CLAIMS} claims of {BATCH} per setup and round from {READY} \
         ready jobs, {rounds} rounds, 1 local shard, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); SETUPS.len()];
    let mut spread: Vec<Vec<usize>> = vec![Vec::new(); SETUPS.len()];
    for _ in 0..rounds {
        for (i, setup) in SETUPS.iter().enumerate() {
            db.batch_execute("TRUNCATE workflow_status CASCADE").await?;
            let limits = QueueLimits {
                group_concurrency: setup.group_concurrency,
                ..QueueLimits::default()
            };
            client.set_queue_limits("bench", limits).await?;
            client.enqueue_many(jobs(setup.groups)).await?;
            db.batch_execute("VACUUM ANALYZE workflow_status").await?;
            for _ in 0..CLAIMS {
                let params = ClaimParams {
                    queue: "bench",
                    limit: BATCH,
                    owner: "bench",
                    lease: Duration::from_secs(60),
                    mode: DequeueMode::Gated { slots: 2 },
                };
                let started = Instant::now();
                let claimed = jobs::claim(shard, params).await?;
                times[i].push(started.elapsed());
                let got = match claimed {
                    Claim::Jobs(jobs) | Claim::HeldBack(jobs) => jobs.len(),
                    Claim::Empty | Claim::Busy => 0,
                };
                anyhow::ensure!(
                    got == BATCH as usize,
                    "{}: claimed {got} of {BATCH}",
                    setup.label
                );
            }
            // How many groups the claims served (turns taken).
            let served: i64 = db
                .query_one(
                    "SELECT count(DISTINCT job_group) FROM workflow_status \
                     WHERE status = 'running'",
                    &[],
                )
                .await?
                .get(0);
            spread[i].push(served as usize);
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let base = median(&mut times[0]);
    println!(
        "{:<34} {:>12} {:>10} {:>22}",
        "ready jobs in", "median ms", "vs none", "groups served (1,280)"
    );
    for ((setup, times), spread) in SETUPS.iter().zip(times.iter_mut()).zip(&spread) {
        let m = median(times);
        println!(
            "{:<34} {:>12.2} {:>10.2} {:>22}",
            setup.label,
            m.as_secs_f64() * 1e3,
            m.as_secs_f64() / base.as_secs_f64(),
            spread.iter().min().copied().unwrap_or(0)
        );
    }
    drop(server);
    Ok(())
}
