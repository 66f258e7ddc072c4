//! A pause in completion writes never becomes a stall, and never lets the
//! outcomes waiting to be written grow without bound (issue 21, §2.1).
//!
//! A second session holds the running rows (`SELECT … FOR UPDATE` in an open
//! transaction) for a few seconds while a worker drains keyed jobs with
//! distinct keys, so the completer's writes wait. Before the fix the buffer
//! credits came back as each outcome reached the completer, so claims went
//! on while nothing was written, the batch grew to every job drained in the
//! hold, and its one statement needed an advisory lock per key: more than the
//! server's lock table holds (`out of shared memory`, SQLSTATE 53200), retried
//! at the same size forever.

use crate::common;

use common::TestShards;
use serde_json::json;
use shardq::shards::ShardSet;
use shardq::{Client, HandlerRegistry, NewJob, Worker, WorkerReport};
use shardq_local::StopMode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long the second session holds the running rows.
const HOLD: Duration = Duration::from_secs(5);

/// How long each job takes.
const NAP: Duration = Duration::from_millis(5);

/// Jobs the worker may hold from claim to written outcome, per job of
/// `worker.buffer_jobs`: the buffer itself, and as many outcomes waiting to
/// be written (see src/worker/credits.rs).
const HELD_PER_BUFFERED: u64 = 2;

fn worker_toml(buffer_jobs: usize, completion_batch: usize) -> String {
    format!(
        "[dequeue]\nbatch_size = 100\nempty_backoff_min_ms = 5\nempty_backoff_max_ms = 20\n\
         [worker]\nqueues = [\"q\"]\nconcurrency = 16\nbuffer_jobs = {buffer_jobs}\n\
         completion_batch = {completion_batch}\n"
    )
}

/// Enqueues `n` keyed jobs, each with its own key.
async fn enqueue_distinct_keys(client: &Client, n: usize) {
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| NewJob::new("q", "nap", json!({})).ordering_key(format!("key-{i}")))
        .collect();
    for chunk in jobs.chunks(1_000) {
        client.enqueue_many(chunk.to_vec()).await.unwrap();
    }
}

/// Once the worker has written `after` outcomes, holds every running row of
/// shard 0 for [`HOLD`] (those a completion is writing right now excepted);
/// returns how many rows it held.
async fn hold_running_rows(set: &ShardSet, stats: &shardq::worker::Stats, after: u64) -> i64 {
    common::wait_until(Duration::from_secs(60), "the first outcomes", || async {
        stats.snapshot().succeeded >= after
    })
    .await;
    let mut client = set.get(0).client().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let held: i64 = tx
        .query_one(
            "SELECT count(*) FROM (SELECT 1 FROM workflow_status \
             WHERE status = 'running' FOR UPDATE SKIP LOCKED) held",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    tokio::time::sleep(HOLD).await;
    tx.commit().await.unwrap();
    held
}

/// Runs a worker over `set` until the queue is empty (within a generous
/// deadline), holding the running rows once it wrote `hold_after` outcomes.
async fn drain_with_a_hold(
    set: &ShardSet,
    config: shardq::Config,
    hold_after: u64,
) -> (WorkerReport, i64) {
    let mut registry = HandlerRegistry::with_builtins();
    // Long enough that claimed jobs sit `running` between claim and write.
    registry.register("nap", |_ctx| async {
        tokio::time::sleep(NAP).await;
        Ok(json!(null))
    });
    let worker = Worker::new(config, set.clone(), registry).stop_when_empty(true);
    let stats = worker.stats();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let held = hold_running_rows(set, &stats, hold_after).await;
    let report = match tokio::time::timeout(Duration::from_secs(120), running).await {
        Ok(report) => report.unwrap(),
        Err(_) => {
            let s = stats.snapshot();
            shutdown.cancel();
            panic!(
                "the worker did not drain the queue within 120 s after the hold: \
                 {} succeeded, {} outcomes unwritten (peak {}), {} running rows",
                s.succeeded,
                s.unwritten,
                s.unwritten_peak,
                common::count_status(set, "running").await
            );
        }
    };
    (report, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_in_completion_writes_keeps_outcomes_bounded_and_every_job_is_written() {
    const JOBS: usize = 20_000;
    const BUFFER: usize = 500;
    let shards = TestShards::databases(1).await;
    let config = shards.config(&worker_toml(BUFFER, 1_000));
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    enqueue_distinct_keys(&client, JOBS).await;

    let (report, held) = drain_with_a_hold(&set, config, 500).await;
    assert!(held > 0, "the hold caught running rows");
    assert_eq!(report.stats.succeeded, JOBS as u64);
    assert_eq!(common::count_status(&set, "running").await, 0);
    assert_eq!(common::count_status(&set, "succeeded").await, JOBS as i64);
    let bound = HELD_PER_BUFFERED * BUFFER as u64;
    assert!(
        report.stats.unwritten_peak <= bound,
        "{} outcomes waited to be written at once; the bound is {bound}",
        report.stats.unwritten_peak
    );
    assert_eq!(report.stats.unwritten, 0);
}

/// A server whose lock table holds well under 1,000 advisory locks (about
/// 900 with these settings, measured on PostgreSQL 15): the size at which
/// the completer's batches are cut by keys does not fit, so a write fails
/// with `out of shared memory` (53200) and must be split to pass.
async fn small_lock_table_server() -> TestShards {
    let shards = TestShards::servers(1).await;
    let (admin, connection) =
        tokio_postgres::connect(&shards.servers[0].admin_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    for setting in ["max_locks_per_transaction = 10", "max_connections = 30"] {
        admin
            .batch_execute(&format!("ALTER SYSTEM SET {setting}"))
            .await
            .unwrap();
    }
    drop(admin);
    let _ = connection.await;
    shards.servers[0].stop(StopMode::Fast).unwrap();
    shards.servers[0].start_again().unwrap();
    shards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_runs_out_of_lock_memory_is_split_and_written() {
    const JOBS: usize = 3_000;
    const BUFFER: usize = 2_000;
    let shards = small_lock_table_server().await;
    let toml = shards
        .toml(&worker_toml(BUFFER, 2_000))
        .replace("pool_size = 12", "pool_size = 8");
    let config = shardq::Config::from_toml(&toml).unwrap();
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    enqueue_distinct_keys(&client, JOBS).await;

    let (report, held) = drain_with_a_hold(&set, config, 200).await;
    assert!(held > 0, "the hold caught running rows");
    assert_eq!(report.stats.succeeded, JOBS as u64);
    assert_eq!(common::count_status(&set, "running").await, 0);
    assert_eq!(common::count_status(&set, "succeeded").await, JOBS as i64);
}
