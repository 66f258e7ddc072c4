//! Does a day of history slow the claim path? Drains the same batch of noop
//! jobs on one fresh local shard with no finished rows, then with `--history`
//! finished rows present (1M by default), alternating the two setups so that
//! machine drift does not favour either, and prints jobs/s side by side.
//!
//! Each setup ends with a CHECKPOINT, so that writing back the setup's pages
//! does not run into the measured drain; each line also says what the drain
//! cost the server per job (WAL bytes, pages read from outside shared
//! buffers), which tells a cache that no longer holds the indexes from extra
//! work in the statements.
//!
//! Run: `cargo bench -p shardq-bench --bench history` (or `-- --history 1000000 --jobs 100000 --rounds 2 --shared-buffers-mb 128`).

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
/// Longer than a backend may hold its statistics before publishing them.
const STATS_SETTLE: std::time::Duration = std::time::Duration::from_secs(11);
/// Jobs per enqueue call.
const ENQUEUE_CHUNK: usize = 20_000;

/// WAL written and pages read from outside shared buffers, database-wide,
/// and autovacuum runs of the jobs table (a small table that churns is
/// vacuumed during a drain, a large one is not). Backends publish their
/// counts when idle, at most 10 s late.
const SERVER_COUNTERS: &str = "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::float8, \
    (SELECT blks_read FROM pg_stat_database WHERE datname = current_database())::float8, \
    (SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'workflow_status')::float8";

/// Pages read from outside shared buffers, by table and index.
const READS_BY_RELATION: &str = "SELECT relname::text, heap_blks_read::float8 \
    FROM pg_statio_all_tables WHERE heap_blks_read > 0 \
    UNION ALL SELECT indexrelname::text, idx_blks_read::float8 \
    FROM pg_statio_all_indexes WHERE idx_blks_read > 0";

/// Relations that read more than this many pages per job are named.
const NAMED_READS: f64 = 0.05;

/// History rows are made the way the queue makes them: inserted in the shape
/// of a new job, then grown in place by their completion and vacuumed. Rows
/// inserted finished are larger than a new job from the start, so each page
/// kept room for one more new job (past the fillfactor reserve) and the
/// measured enqueues went one to a page, scattered over the whole history:
/// two heap reads per job that a history the queue leaves behind never causes.
const ADD_HISTORY: &str = "INSERT INTO workflow_status \
    (shard_key, queue, handler, payload, status, run_at, max_attempts) \
    SELECT (g % 65536)::int, 'bench', 'noop', '{}', 'queued', now(), 20 \
    FROM generate_series(1, $1::bigint) AS g";
const FINISH_HISTORY: &str = "UPDATE workflow_status SET status = 'succeeded', attempts = 1, \
    started_at = now(), finished_at = now(), output = 'null'";

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let jobs = flag(&args, "--jobs", DEFAULT_JOBS)?;
    let history = flag(&args, "--history", DEFAULT_HISTORY as usize)? as i64;
    let rounds = flag(&args, "--rounds", DEFAULT_ROUNDS)?;
    let shared_buffers_mb = flag(&args, "--shared-buffers-mb", 0)?;

    let (server, config, shards) = one_shard("[worker]\nqueues = [\"bench\"]\n").await?;
    if shared_buffers_mb > 0 {
        let (admin, conn) =
            tokio_postgres::connect(&server.admin_url(), tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        admin
            .batch_execute(&format!(
                "ALTER SYSTEM SET shared_buffers = '{shared_buffers_mb}MB'"
            ))
            .await?;
        server.stop(shardq_local::StopMode::Fast)?;
        server.start_again()?;
    }
    let client = Client::from_shards(shards.clone(), config.limits.clone());
    let db = shards.get(0).client().await?;
    // Setting up millions of finished rows (and vacuuming them) outlasts
    // shardq's statement deadline; the drains keep it.
    db.batch_execute("SET statement_timeout = 0").await?;

    let buffers: String = db.query_one("SHOW shared_buffers", &[]).await?.get(0);
    println!(
        "history benchmark: {jobs} noop jobs drained per measurement, {rounds} rounds per setup, 1 local shard (shared_buffers {buffers}); {} cores shared by PostgreSQL and the worker",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut results: Vec<(&str, f64)> = Vec::new();
    for round in 0..rounds {
        for with_history in [false, true] {
            db.batch_execute("TRUNCATE workflow_status CASCADE").await?;
            if with_history {
                db.execute(ADD_HISTORY, &[&history]).await?;
                db.execute(FINISH_HISTORY, &[]).await?;
            }
            db.batch_execute("VACUUM ANALYZE workflow_status").await?;
            db.batch_execute("CHECKPOINT").await?;
            let mut left = jobs;
            while left > 0 {
                let n = left.min(ENQUEUE_CHUNK);
                let batch = (0..n)
                    .map(|_| NewJob::new("bench", "noop", serde_json::json!({})))
                    .collect();
                client.enqueue_many(batch).await?;
                left -= n;
            }
            tokio::time::sleep(STATS_SETTLE).await;
            let before = db.query_one(SERVER_COUNTERS, &[]).await?;
            let reads_before = reads_by_relation(&db).await?;
            let started = Instant::now();
            let report = Worker::new(
                config.clone(),
                shards.clone(),
                HandlerRegistry::with_builtins(),
            )
            .stop_when_empty(true)
            .run(CancellationToken::new())
            .await;
            let rate = report.stats.succeeded as f64 / started.elapsed().as_secs_f64();
            tokio::time::sleep(STATS_SETTLE).await;
            let after = db.query_one(SERVER_COUNTERS, &[]).await?;
            let mut readers: Vec<(String, f64)> = reads_by_relation(&db)
                .await?
                .into_iter()
                .map(|(name, n)| {
                    let per_job = (n - reads_before.get(&name).unwrap_or(&0.0)) / jobs as f64;
                    (name, per_job)
                })
                .filter(|r| r.1 > NAMED_READS)
                .collect();
            readers.sort_by(|a, b| b.1.total_cmp(&a.1));
            let per_job =
                |i: usize| (after.get::<_, f64>(i) - before.get::<_, f64>(i)) / jobs as f64;
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
            println!(
                "  round {round}  {label:<13} {rate:>10.0} jobs/s  {:>6.0} WAL bytes/job  {:>6.2} pages read/job  {} autovacuums",
                per_job(0),
                per_job(1),
                after.get::<_, f64>(2) - before.get::<_, f64>(2)
            );
            for (name, n) in readers {
                println!("{:>52}{n:>6.2} of them {name}", "");
            }
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
        // An even count: the mean of the middle two.
        (v[(v.len() - 1) / 2] + v[v.len() / 2]) / 2.0
    };
    let (none, some) = (median("no history"), median("with history"));
    println!("median: no history {none:.0} jobs/s, with {history} finished rows {some:.0} jobs/s: ratio {:.2}", some / none);
    Ok(())
}

/// Cumulative pages read from outside shared buffers, by relation name.
async fn reads_by_relation(
    db: &tokio_postgres::Client,
) -> Result<std::collections::HashMap<String, f64>> {
    let rows = db.query(READS_BY_RELATION, &[]).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}
