//! The statement ceiling: what one shard sustains when a client does nothing
//! but claim big batches and write them back, with no execution and no
//! pipeline in between. The pipelined worker is measured against it.

use super::drained::Drained;
use super::pgcpu::{PgCpu, Sampler};
use super::server::{BenchServer, QUEUE};
use crate::procfs::{self, Clock};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;
use shardq::config::{Backoff, DequeueMode};
use shardq::job::{Completion, Outcome};
use shardq::shards::Shard;
use shardq::store::jobs::{self, Claim, ClaimParams, CompleteMany};
use std::time::{Duration, Instant};

pub use super::drained::BATCH;

/// Concurrent dequeuers tried, one run each.
pub const DEQUEUERS: &[usize] = &[1, 2, 4];

/// Long enough that no lease expires during a run.
const LEASE: Duration = Duration::from_secs(600);

/// Which statements a ceiling run drains with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Statements {
    /// shardq's own claim and fenced completion.
    Shardq,
    /// The least a queue can do (see [`super::minimal`]).
    Minimal,
}

/// One ceiling run.
#[derive(Debug, Clone, Serialize)]
pub struct CeilingRun {
    /// Whose statements.
    pub statements: Statements,
    /// Concurrent claim+complete loops.
    pub dequeuers: usize,
    /// Jobs claimed and completed.
    pub jobs: u64,
    /// Seconds to enqueue the jobs before the run.
    pub prefill_s: f64,
    /// Seconds from the first claim to the last completion.
    pub wall_s: f64,
    /// `jobs / wall_s`.
    pub jobs_per_s: f64,
    /// CPU seconds of this bench process (the client side).
    pub client_cpu_s: f64,
    /// CPU seconds of the PostgreSQL server's processes, by role.
    pub postgres_cpu: PgCpu,
    /// CPU seconds of every other process on the machine meanwhile (noise).
    pub others_cpu_s: f64,
    /// WAL the server wrote during the run, bytes.
    pub wal_bytes: i64,
    /// Mean round trip of one claim statement, ms.
    pub claim_ms: f64,
    /// Mean round trip of one completion statement, ms.
    pub complete_ms: f64,
}

/// Refills `jobs` jobs, then drains them with `dequeuers` concurrent loops.
pub async fn run(
    server: &BenchServer,
    clock: Clock,
    jobs: usize,
    dequeuers: usize,
    statements: Statements,
) -> Result<CeilingRun> {
    let prefill = match statements {
        Statements::Shardq => server.refill(jobs).await?,
        Statements::Minimal => super::minimal::refill(server.shard(), jobs).await?,
    };
    server.warm_up(dequeuers).await?;
    let machine_before = procfs::machine_busy_ticks()?;
    let client_before = procfs::stat("self")?.own();
    let wal_before = server.wal_position().await?;
    let pg = Sampler::start(server.postmaster())?;
    let started = Instant::now();
    let loops: Vec<_> = (0..dequeuers)
        .map(|i| {
            let owner = format!("bench-ceiling-{i}");
            let shard = server.shard().clone();
            match statements {
                Statements::Shardq => tokio::spawn(drain(shard, owner, server.retry_backoff())),
                Statements::Minimal => tokio::spawn(super::minimal::drain(shard)),
            }
        })
        .collect();
    let mut total = Drained::default();
    for handle in loops {
        let one = handle.await.context("a dequeuer panicked")??;
        total.jobs += one.jobs;
        total.claims += one.claims;
        total.claim_time += one.claim_time;
        total.completes += one.completes;
        total.complete_time += one.complete_time;
    }
    let done = total.jobs;
    let wall = started.elapsed().as_secs_f64();
    let client_cpu = procfs::stat("self")?.own() - client_before;
    let postgres_cpu = pg.finish(clock).await?;
    let wal_bytes = server.wal_position().await? - wal_before;
    let machine = clock.secs(procfs::machine_busy_ticks()? - machine_before);
    if done != jobs as u64 {
        bail!("ceiling run with {dequeuers} dequeuers completed {done} jobs, expected {jobs}");
    }
    Ok(CeilingRun {
        statements,
        dequeuers,
        jobs: done,
        prefill_s: prefill.as_secs_f64(),
        wall_s: wall,
        jobs_per_s: done as f64 / wall,
        client_cpu_s: clock.secs(client_cpu),
        others_cpu_s: (machine - clock.secs(client_cpu) - postgres_cpu.total_s).max(0.0),
        postgres_cpu,
        wal_bytes,
        claim_ms: mean_ms(total.claim_time, total.claims),
        complete_ms: mean_ms(total.complete_time, total.completes),
    })
}

fn mean_ms(total: Duration, count: u32) -> f64 {
    total.as_secs_f64() * 1e3 / f64::from(count.max(1))
}

/// Claims and completes batches until the queue is empty.
async fn drain(shard: Shard, owner: String, retry: Backoff) -> Result<Drained> {
    let mut done = Drained::default();
    loop {
        let params = ClaimParams {
            queue: QUEUE,
            limit: BATCH,
            owner: &owner,
            lease: LEASE,
            mode: DequeueMode::Ungated,
        };
        let sent = Instant::now();
        let claimed = jobs::claim(&shard, params).await?;
        done.claims += 1;
        done.claim_time += sent.elapsed();
        let jobs = match claimed {
            Claim::Jobs(jobs) | Claim::HeldBack(jobs) if !jobs.is_empty() => jobs,
            // Ungated claims never see a busy slot; empty means drained.
            _ => return Ok(done),
        };
        let completions: Vec<Completion> = jobs
            .iter()
            .map(|job| Completion::of(job, Outcome::Succeeded(Value::Null)))
            .collect();
        let sent = Instant::now();
        let written = jobs::complete_many(
            &shard,
            CompleteMany {
                owner: &owner,
                retry,
                done: &completions,
            },
        )
        .await?;
        done.completes += 1;
        done.complete_time += sent.elapsed();
        if written.fenced > 0 {
            bail!("{} completions fenced out; leases expired?", written.fenced);
        }
        done.jobs += written.succeeded;
    }
}

/// The fastest run.
pub fn best(runs: &[CeilingRun]) -> Option<&CeilingRun> {
    runs.iter()
        .max_by(|a, b| a.jobs_per_s.total_cmp(&b.jobs_per_s))
}
