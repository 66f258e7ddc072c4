//! A run reads its workflow's step log only when the log may hold steps:
//! the workflow's first claim knows it empty while its lease lasts, so its
//! steps cost their record alone; a later claim, or a first one past its
//! lease, reads it. Shown on a shard whose log reads fail.

use crate::common;

use common::TestShards;
use shardq::{HandlerRegistry, JobId, JobOutcome, NewJob, Shardq};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "logged";

/// What a read of the broken log fails with.
const READ_FAILS: &str = "the step log was read";

/// A migrated shard whose worker runs one job at a time, with leases of
/// `lease_ms`, and whose step log reads fail.
async fn shardq(lease_ms: u64) -> (TestShards, Shardq) {
    let shards = TestShards::databases(1).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nconcurrency = 1\nlease_ms = {lease_ms}\n\
         retry_backoff_min_ms = 10\nretry_backoff_max_ms = 20\n"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE OR REPLACE FUNCTION shardq_step_log(p_shard_key int, p_id bigint, \
                 p_owner text, p_fence bigint) \
             RETURNS TABLE (step_name text, output jsonb, held boolean, lease_left_us bigint) \
             LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION '{READ_FAILS}'; END $$"
        ))
        .await
        .unwrap();
    (shards, shardq)
}

/// Runs a worker with `handlers` until `job` has finished; its id and outcome.
async fn run(shardq: &Shardq, handlers: HandlerRegistry, job: NewJob) -> (JobId, JobOutcome) {
    let id = shardq.client().enqueue(job).await.unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    let outcome = shardq
        .client()
        .result(id, Duration::from_secs(60))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    (id, outcome)
}

async fn recorded_steps(shardq: &Shardq, id: JobId) -> i64 {
    shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT count(*) FROM workflow_steps WHERE shard_key = $1 AND workflow_id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap()
        .get(0)
}

/// The first claim records two steps and fails on purpose, without a read
/// (a read would have failed it before its first step); the retry, a
/// second claim, must read the log to replay them, and its read fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_workflows_later_claims_read_its_step_log() {
    let (_shards, shardq) = shardq(30_000).await;
    let runs = Arc::new(AtomicU32::new(0));
    let mut handlers = HandlerRegistry::new();
    let counted = runs.clone();
    handlers.register("two_steps", move |ctx| {
        let runs = counted.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            ctx.step("a", || async { Ok(1) }).await?;
            ctx.step("b", || async { Ok(2) }).await?;
            match ctx.attempt {
                1 => Err("fails once, after its steps".into()),
                _ => Ok(serde_json::Value::Null),
            }
        }
    });
    let job = NewJob::new(QUEUE, "two_steps", serde_json::json!({})).max_attempts(2);
    let (id, outcome) = run(&shardq, handlers, job).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2, "two claims ran it");
    assert_eq!(
        recorded_steps(&shardq, id).await,
        2,
        "the first claim recorded both steps without reading the log"
    );
    match outcome {
        JobOutcome::Dead(error) => assert!(error.contains(READ_FAILS), "{error}"),
        other => panic!("the retry reads the log and fails, got {other:?}"),
    }
}

/// A first claim trusts its empty log only while its lease lasts: a step
/// reached after it (the leaser extended the lease meanwhile) reads the
/// log, as a run that lost its lease must, to find a new owner's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_claim_past_its_first_lease_reads_the_log() {
    let (_shards, shardq) = shardq(400).await;
    let mut handlers = HandlerRegistry::new();
    handlers.register("late_step", |ctx| async move {
        tokio::time::sleep(Duration::from_millis(900)).await;
        ctx.step("a", || async { Ok(1) }).await?;
        Ok(serde_json::Value::Null)
    });
    let job = NewJob::new(QUEUE, "late_step", serde_json::json!({})).max_attempts(1);
    let (id, outcome) = run(&shardq, handlers, job).await;
    match outcome {
        JobOutcome::Dead(error) => assert!(error.contains(READ_FAILS), "{error}"),
        other => panic!("the late step reads the log and fails, got {other:?}"),
    }
    assert_eq!(recorded_steps(&shardq, id).await, 0);
}
