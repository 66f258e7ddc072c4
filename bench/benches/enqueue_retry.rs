//! What does an enqueue that is safe to retry cost? Times the enqueue shardq
//! made before (one insert whose ids the identity column assigns:
//! `store::jobs::insert_many`) against the one `Client::enqueue_many` makes
//! now (the ids taken first by `shardq_reserve_ids`, then the insert under
//! them with ON CONFLICT on the primary key), side by side in the same run,
//! on one fresh local shard, for calls of 1, 10, 100 and 1,000 jobs.
//!
//! Each (variant, size) runs for `--block-ms` of back-to-back calls on one
//! pooled connection (`pool_size = 1`: every statement of both variants goes
//! through the same backend); rounds rotate which variant goes first, and
//! the table is truncated (untimed) before each block, so both meet the
//! same table. Per job it reports the client's wall time (one call at a
//! time: latency bound, not the server's ceiling), the backend's CPU time
//! from `/proc` (what a fleet pays per job on every shard) and the WAL bytes
//! written (`pg_current_wal_lsn`).
//!
//! Run: `cargo bench -p shardq-bench --bench enqueue_retry` (or
//! `-- --rounds 3 --block-ms 1500`).

#[path = "support.rs"]
mod support;
use anyhow::{Context, Result};
use shardq::job::NewJob;
use shardq::store::jobs::{self, NewRow};
use shardq::Client;
use std::time::{Duration, Instant};
use support::{flag, one_shard};

/// Jobs per call.
const SIZES: [usize; 4] = [1, 10, 100, 1_000];
/// Blocks of each (variant, size).
const DEFAULT_ROUNDS: usize = 3;
/// Length of one block of calls, ms: long enough for `/proc`'s 10 ms ticks.
const DEFAULT_BLOCK_MS: usize = 1_500;
/// The library's default attempt limit (what the client would write).
const MAX_ATTEMPTS: i32 = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// One insert, ids from the identity column (not safe to retry).
    Before,
    /// Ids reserved, then the idempotent insert (`Client::enqueue_many`).
    After,
    /// Reference: the old insert plus one primary-key probe, what any second
    /// statement per call costs.
    Probe,
}

const VARIANTS: [Variant; 3] = [Variant::Before, Variant::After, Variant::Probe];

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Before => "before (insert, server ids)",
            Variant::After => "after (reserve ids + insert)",
            Variant::Probe => "ref: insert + 1 pk probe",
        }
    }
}

/// Totals of one variant and size over its blocks.
#[derive(Default, Clone, Copy)]
struct Totals {
    calls: u64,
    jobs: u64,
    wall: Duration,
    ticks: u64,
    wal_bytes: u64,
}

/// CPU ticks of process `pid` (utime + stime, fields 14 and 15).
fn cpu_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 2..)?
        .split_whitespace()
        .collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Clock ticks per second of `/proc/<pid>/stat`.
fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The server's WAL position in bytes.
async fn wal_position(db: &shardq::shards::PooledClient) -> Result<u64> {
    let row = db
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

fn jobs_of(size: usize) -> Vec<NewJob> {
    (0..size)
        .map(|i| NewJob::new("bench", "noop", serde_json::json!({ "i": i })))
        .collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rounds = flag(&args, "--rounds", DEFAULT_ROUNDS)?;
    let block = Duration::from_millis(flag(&args, "--block-ms", DEFAULT_BLOCK_MS)? as u64);
    // One connection (a key of the shard's table), so that both variants'
    // statements run on one backend.
    let (_server, config, shards) = one_shard("pool_size = 1\n").await?;
    let shard = shards.get(0).clone();
    let client = Client::from_shards(shards.clone(), config.limits.clone());
    let db = shard.client().await?;
    let backend: i32 = db.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
    drop(db);
    let hz = clock_ticks_per_second();
    println!(
        "enqueue retry cost: 1 local shard, one call at a time on 1 pooled connection, \
         {rounds} rounds of {block:?} per variant and size, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if cpu_ticks(backend).is_none() {
        println!("backend CPU: not readable from /proc here; left out");
    }
    let mut totals = [[Totals::default(); SIZES.len()]; VARIANTS.len()];
    for round in 0..rounds {
        let mut order = VARIANTS;
        order.rotate_left(round % VARIANTS.len());
        for (s, &size) in SIZES.iter().enumerate() {
            for variant in order {
                let db = shard.client().await?;
                db.batch_execute("TRUNCATE workflow_status CASCADE; CHECKPOINT")
                    .await?;
                let wal_before = wal_position(&db).await?;
                drop(db);
                // The returned connection is cleaned in the background:
                // not inside the measured block.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let jobs = jobs_of(size);
                let t = &mut totals[variant as usize][s];
                let ticks_before = cpu_ticks(backend).unwrap_or(0);
                let started = Instant::now();
                while started.elapsed() < block {
                    match variant {
                        Variant::Before | Variant::Probe => {
                            let rows: Vec<NewRow> = jobs
                                .iter()
                                .map(|job| NewRow {
                                    shard_key: 0,
                                    job,
                                    max_attempts: MAX_ATTEMPTS,
                                })
                                .collect();
                            let ids = jobs::insert_many(&shard, &rows).await?;
                            if variant == Variant::Probe {
                                jobs::exists(&shard, ids[0]).await?;
                            }
                        }
                        Variant::After => {
                            client.enqueue_many(jobs.clone()).await.context("enqueue")?;
                        }
                    }
                    t.calls += 1;
                    t.jobs += size as u64;
                }
                t.wall += started.elapsed();
                t.ticks += cpu_ticks(backend).unwrap_or(0) - ticks_before;
                let db = shard.client().await?;
                t.wal_bytes += wal_position(&db).await? - wal_before;
            }
        }
    }
    println!();
    println!(
        "{:<30} {:>6} {:>10} {:>12} {:>14} {:>14}",
        "variant", "jobs", "calls/s", "jobs/s", "backend µs/job", "WAL bytes/job"
    );
    for (s, &size) in SIZES.iter().enumerate() {
        for variant in VARIANTS {
            let t = totals[variant as usize][s];
            let secs = t.wall.as_secs_f64();
            println!(
                "{:<30} {:>6} {:>10.0} {:>12.0} {:>14.1} {:>14.0}",
                variant.label(),
                size,
                t.calls as f64 / secs,
                t.jobs as f64 / secs,
                t.ticks as f64 / hz * 1e6 / t.jobs as f64,
                t.wal_bytes as f64 / t.jobs as f64
            );
        }
        let (b, a) = (totals[0][s], totals[1][s]);
        let per_job = |t: Totals| t.ticks as f64 / t.jobs as f64;
        let rate = |t: Totals| t.jobs as f64 / t.wall.as_secs_f64();
        println!(
            "{:<30} {:>6} {:>10} {:>11.2}x {:>13.2}x",
            "after / before",
            size,
            "",
            rate(a) / rate(b),
            per_job(a) / per_job(b)
        );
    }
    println!(
        "(ref: the old insert followed by one primary-key probe per call, the price of a \
         second statement as such)"
    );
    println!(
        "(backend µs/job: CPU time of the one backend serving the connection, from /proc, \
         {hz} ticks/s; jobs/s: one call at a time, so it shows the round trip, not the \
         server's ceiling)"
    );
    Ok(())
}
