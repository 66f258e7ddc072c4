//! Does a day of history slow the claim path? Drains the same batch of noop
//! jobs on one fresh local shard with no finished rows, then with `--history`
//! finished rows present (1M by default), alternating the two setups so that
//! machine drift does not favour either, and prints jobs/s side by side.
//!
//! Run: `cargo bench -p shardq-bench --bench history` (or `-- --history 1000000 --jobs 100000 --rounds 2`).

#[path = "support.rs"]
mod support;
use anyhow::Result;
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use std::time::Instant;
use support::{flag, one_shard};
use tokio_util::sync::CancellationToken;

/// Ready jobs drained per measurement.
const DEFAULT_JOBS: usize = 100_000;
/// Finished rows present in the "history" setup: about a day at ~12 jobs/s.
const DEFAULT_HISTORY: i64 = 1_000_000;
/// Measurements per setup.
const DEFAULT_ROUNDS: usize = 2;
/// Jobs per enqueue call.
const ENQUEUE_CHUNK: usize = 20_000;

const ADD_HISTORY: &str = "INSERT INTO workflow_status \
    (shard_key, queue, handler, payload, status, attempts, created_at, started_at, finished_at, output) \
    SELECT (g % 65536)::int, 'bench', 'noop', '{}', 'succeeded', 1, now(), now(), now(), 'null' \
    FROM generate_series(1, $1::bigint) AS g";

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let jobs = flag(&args, "--jobs", DEFAULT_JOBS)?;
    let history = flag(&args, "--history", DEFAULT_HISTORY as usize)? as i64;
    let rounds = flag(&args, "--rounds", DEFAULT_ROUNDS)?;

    let (_server, config, shards) = one_shard("[worker]\nqueues = [\"bench\"]\n").await?;
    let client = Client::from_shards(shards.clone(), config.limits.clone());
    let db = shards.get(0).client().await?;
    // Setting up millions of finished rows (and vacuuming them) outlasts
    // shardq's statement deadline; the drains keep it.
    db.batch_execute("SET statement_timeout = 0").await?;

    println!(
        "history benchmark: {jobs} noop jobs drained per measurement, {rounds} rounds per setup, 1 local shard; {} cores shared by PostgreSQL and the worker",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut results: Vec<(&str, f64)> = Vec::new();
    for round in 0..rounds {
        for with_history in [false, true] {
            db.batch_execute("TRUNCATE workflow_status CASCADE").await?;
            if with_history {
                db.execute(ADD_HISTORY, &[&history]).await?;
            }
            db.batch_execute("VACUUM ANALYZE workflow_status").await?;
            let mut left = jobs;
            while left > 0 {
                let n = left.min(ENQUEUE_CHUNK);
                let batch = (0..n)
                    .map(|_| NewJob::new("bench", "noop", serde_json::json!({})))
                    .collect();
                client.enqueue_many(batch).await?;
                left -= n;
            }
            let started = Instant::now();
            let report = Worker::new(config.clone(), shards.clone(), HandlerRegistry::new())
                .stop_when_empty(true)
                .run(CancellationToken::new())
                .await;
            let rate = report.stats.succeeded as f64 / started.elapsed().as_secs_f64();
            anyhow::ensure!(
                report.stats.succeeded as usize == jobs,
                "round {round}: drained {} of {jobs}",
                report.stats.succeeded
            );
            let label = if with_history {
                "with history"
            } else {
                "no history"
            };
            println!("  round {round}  {label:<13} {rate:>10.0} jobs/s");
            results.push((label, rate));
        }
    }
    let median = |label: &str| {
        let mut v: Vec<f64> = results
            .iter()
            .filter(|r| r.0 == label)
            .map(|r| r.1)
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (none, some) = (median("no history"), median("with history"));
    println!("median: no history {none:.0} jobs/s, with {history} finished rows {some:.0} jobs/s: ratio {:.2}", some / none);
    Ok(())
}
