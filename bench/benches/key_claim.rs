//! What does per-key ordering cost a claim? Times one claim statement taking
//! a whole batch on one fresh local shard, for the same number of ready jobs
//! laid out as: unkeyed jobs, one key's run, and distinct keys; and one key's
//! run at several batch sizes, to show the cost grows with the batch, not
//! with the square of the run. Setups alternate round by round so machine
//! drift favours none; medians are printed side by side.
//!
//! Run: `cargo bench -p shardq-bench --bench key_claim` (or `-- --rounds 7`).

#[path = "support.rs"]
mod support;
use anyhow::Result;
use shardq::config::DequeueMode;
use shardq::store::jobs::{self, Claim, ClaimParams};
use shardq::{Client, NewJob};
use std::time::{Duration, Instant};
use support::{flag, one_shard};

const DEFAULT_ROUNDS: usize = 7;

/// How the ready jobs are keyed.
#[derive(Clone, Copy)]
enum Layout {
    Unkeyed,
    OneKey,
    DistinctKeys,
}

struct Setup {
    label: &'static str,
    layout: Layout,
    jobs: usize,
    batch: u32,
}

const SETUPS: &[Setup] = &[
    Setup {
        label: "1,000 unkeyed, batch 1,000",
        layout: Layout::Unkeyed,
        jobs: 1000,
        batch: 1000,
    },
    Setup {
        label: "1,000 of one key, batch 1,000",
        layout: Layout::OneKey,
        jobs: 1000,
        batch: 1000,
    },
    Setup {
        label: "1,000 distinct keys, batch 1,000",
        layout: Layout::DistinctKeys,
        jobs: 1000,
        batch: 1000,
    },
    Setup {
        label: "1,000 of one key, batch 100",
        layout: Layout::OneKey,
        jobs: 1000,
        batch: 100,
    },
    Setup {
        label: "1,000 of one key, batch 500",
        layout: Layout::OneKey,
        jobs: 1000,
        batch: 500,
    },
];

fn jobs(layout: Layout, n: usize) -> Vec<NewJob> {
    (0..n)
        .map(|i| {
            let job = NewJob::new("bench", "noop", serde_json::json!({}));
            match layout {
                Layout::Unkeyed => job,
                Layout::OneKey => job.ordering_key("the-key"),
                Layout::DistinctKeys => job.ordering_key(format!("key-{i}")),
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
        "key claim benchmark: one claim statement per measurement, {rounds} rounds, 1 local shard, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); SETUPS.len()];
    for _ in 0..rounds {
        for (setup, times) in SETUPS.iter().zip(times.iter_mut()) {
            db.batch_execute("TRUNCATE workflow_status CASCADE").await?;
            client.enqueue_many(jobs(setup.layout, setup.jobs)).await?;
            db.batch_execute("VACUUM ANALYZE workflow_status").await?;
            let params = ClaimParams {
                queue: "bench",
                limit: setup.batch,
                owner: "bench",
                lease: Duration::from_secs(60),
                mode: DequeueMode::Gated { slots: 2 },
            };
            let started = Instant::now();
            let claimed = jobs::claim(shard, params).await?;
            times.push(started.elapsed());
            let got = match claimed {
                Claim::Jobs(jobs) => jobs.len(),
                Claim::HeldBack(jobs) => jobs.len(),
                Claim::Empty | Claim::Busy => 0,
            };
            anyhow::ensure!(
                got == setup.batch as usize,
                "{}: claimed {got} of {}",
                setup.label,
                setup.batch
            );
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let base = median(&mut times[0]);
    println!(
        "{:<34} {:>12} {:>12}",
        "ready jobs, claim size", "median ms", "vs unkeyed"
    );
    for (setup, times) in SETUPS.iter().zip(times.iter_mut()) {
        let m = median(times);
        println!(
            "{:<34} {:>12.2} {:>12.2}",
            setup.label,
            m.as_secs_f64() * 1e3,
            m.as_secs_f64() / base.as_secs_f64()
        );
    }
    drop(server);
    Ok(())
}
