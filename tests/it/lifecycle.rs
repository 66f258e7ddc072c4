//! The job lifecycle, one test per feature: durable steps, lease recovery and
//! attempt limits, stored retry backoff, delayed jobs, priorities,
//! deduplication, cancellation, transactional enqueue, retention.

use crate::common;

use common::TestShards;
use shardq::client::JobOutcome;
use shardq::config::DequeueMode;
use shardq::shards::{Shard, ShardSet};
use shardq::store::jobs::{self, Claim, ClaimParams};
use shardq::store::upkeep;
use shardq::{
    Client, ClientError, Config, HandlerRegistry, JobId, NewJob, OnDuplicate, StepError, Worker,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const FAST: &str = "
[dequeue]
empty_backoff_min_ms = 5
empty_backoff_max_ms = 10
[worker]
queues = [\"q\"]
maintenance_interval_ms = 50
retry_backoff_min_ms = 20
retry_backoff_max_ms = 40
";

struct Setup {
    _shards: TestShards,
    config: Config,
    set: ShardSet,
    client: Client,
}

async fn setup(shard_count: usize, extra: &str) -> Setup {
    let shards = TestShards::databases(shard_count).await;
    let config = shards.config(extra);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    Setup {
        _shards: shards,
        config,
        set,
        client,
    }
}

/// Runs a worker until `until` resolves, then stops it.
async fn run_worker_until<F: std::future::Future>(
    s: &Setup,
    registry: HandlerRegistry,
    until: F,
) -> F::Output {
    let stop = CancellationToken::new();
    let worker =
        tokio::spawn(Worker::new(s.config.clone(), s.set.clone(), registry).run(stop.clone()));
    let out = tokio::time::timeout(Duration::from_secs(60), until)
        .await
        .expect("in time");
    stop.cancel();
    worker.await.unwrap();
    out
}

async fn query_one(shard: &Shard, sql: &str, id: JobId) -> tokio_postgres::Row {
    shard
        .client()
        .await
        .unwrap()
        .query_one(sql, &[&id.shard_key, &id.id])
        .await
        .unwrap()
}

fn claim_params(owner: &str, lease_ms: u64) -> ClaimParams<'_> {
    ClaimParams {
        queue: "q",
        limit: 10,
        owner,
        lease: Duration::from_millis(lease_ms),
        mode: DequeueMode::Gated { slots: 2 },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_steps_are_not_repeated_when_a_workflow_runs_again() {
    let s = setup(2, FAST).await;
    let a_runs = Arc::new(AtomicU32::new(0));
    let mut registry = HandlerRegistry::with_builtins();
    let runs = a_runs.clone();
    registry.register("wf", move |ctx| {
        let runs = runs.clone();
        async move {
            let a: i64 = ctx
                .step("a", || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok(41)
                })
                .await?;
            // Fails on the first attempt, after step "a" was recorded.
            let b: i64 = ctx
                .step("b", || async move {
                    if ctx.attempt == 1 {
                        Err("transient".into())
                    } else {
                        Ok(1)
                    }
                })
                .await?;
            Ok(serde_json::json!({ "sum": a + b }))
        }
    });
    let id = s
        .client
        .enqueue(NewJob::new("q", "wf", serde_json::json!({})))
        .await
        .unwrap();
    let outcome = run_worker_until(&s, registry, s.client.result(id, Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(
        outcome,
        JobOutcome::Succeeded(serde_json::json!({ "sum": 42 }))
    );
    assert_eq!(
        a_runs.load(Ordering::SeqCst),
        1,
        "step a ran once over two attempts"
    );
    let row = query_one(
        s.set.for_key(id.shard_key),
        "SELECT attempts FROM workflow_status WHERE shard_key = $1 AND id = $2",
        id,
    )
    .await;
    assert_eq!(row.get::<_, i32>(0), 2);
}

/// A run reads its step log once and keeps what it records: a step name
/// called a second time in the same run returns the first call's output
/// without running, as on a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_name_called_twice_in_a_run_returns_its_first_output() {
    let s = setup(1, FAST).await;
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("twice", move |ctx| async move {
        let first: i64 = ctx.step("n", || async { Ok(1) }).await?;
        let second: i64 = ctx.step("n", || async { Ok(2) }).await?;
        Ok(serde_json::json!([first, second]))
    });
    let id = s
        .client
        .enqueue(NewJob::new("q", "twice", serde_json::json!({})))
        .await
        .unwrap();
    let outcome = run_worker_until(&s, registry, s.client.result(id, Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(serde_json::json!([1, 1])));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_step_that_no_longer_deserialises_fails_clearly() {
    let s = setup(1, FAST).await;
    let id = s
        .client
        .enqueue(NewJob::new("q", "typed", serde_json::json!({})).max_attempts(1))
        .await
        .unwrap();
    // As an earlier claim (fence 1) of an older version of the handler left it.
    s.set.get(0).client().await.unwrap()
        .batch_execute(&format!("UPDATE workflow_status SET fence = 1 WHERE shard_key = {0} AND id = {1}; \
            INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output) VALUES ({0}, {1}, 'n', '\"text\"')", id.shard_key, id.id))
        .await.unwrap();
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("typed", |ctx| async move {
        let n: i64 = ctx.step("n", || async { Ok(1) }).await?;
        Ok(serde_json::json!(n))
    });
    let outcome = run_worker_until(&s, registry, s.client.result(id, Duration::from_secs(30)))
        .await
        .unwrap();
    match outcome {
        JobOutcome::Dead(error) => assert!(
            error.contains("does not deserialise as the requested type"),
            "{error}"
        ),
        other => panic!("expected a dead job, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_leases_are_recovered_with_attempts_kept_until_dead_and_recovery_is_gated() {
    let s = setup(1, FAST).await;
    let shard = s.set.get(0);
    let id = s
        .client
        .enqueue(NewJob::new("q", "noop", serde_json::json!({})).max_attempts(2))
        .await
        .unwrap();

    // A worker claims and "crashes": its 100 ms lease runs out.
    assert!(matches!(
        jobs::claim(shard, claim_params("crashed-1", 100))
            .await
            .unwrap(),
        Claim::Jobs(_)
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;

    // While another process holds the recovery lock, this one does nothing.
    let holder = shard.client().await.unwrap();
    holder
        .execute(
            "SELECT pg_advisory_lock($1, 0)",
            &[&shardq::store::locks::maintenance_class()],
        )
        .await
        .unwrap();
    assert_eq!(
        upkeep::recover_expired(shard, 10).await.unwrap(),
        Default::default()
    );
    holder
        .execute(
            "SELECT pg_advisory_unlock($1, 0)",
            &[&shardq::store::locks::maintenance_class()],
        )
        .await
        .unwrap();

    let recovered = upkeep::recover_expired(shard, 10).await.unwrap();
    assert_eq!(recovered.requeued, 1);
    let row = query_one(
        shard,
        "SELECT status, attempts FROM workflow_status WHERE shard_key = $1 AND id = $2",
        id,
    )
    .await;
    assert_eq!(
        (row.get::<_, String>(0).as_str(), row.get::<_, i32>(1)),
        ("queued", 1)
    );

    // Second crash on the last attempt: dead, with the reason kept.
    assert!(matches!(
        jobs::claim(shard, claim_params("crashed-2", 100))
            .await
            .unwrap(),
        Claim::Jobs(_)
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(upkeep::recover_expired(shard, 10).await.unwrap().dead, 1);
    let row = query_one(
        shard,
        "SELECT status, error FROM workflow_status WHERE shard_key = $1 AND id = $2",
        id,
    )
    .await;
    assert_eq!(row.get::<_, String>(0), "dead");
    assert!(row
        .get::<_, String>(1)
        .contains("lease expired on attempt 2 of 2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_retry_after_a_stored_backoff_then_die_with_the_last_error() {
    let s = setup(
        1,
        &FAST
            .replace("retry_backoff_min_ms = 20", "retry_backoff_min_ms = 2000")
            .replace("retry_backoff_max_ms = 40", "retry_backoff_max_ms = 4000"),
    )
    .await;
    let shard = s.set.get(0);
    let id = s
        .client
        .enqueue(NewJob::new("q", "boom", serde_json::json!({})).max_attempts(2))
        .await
        .unwrap();
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("boom", |ctx| async move {
        Err(format!("boom on attempt {}", ctx.attempt).into())
    });
    let probe = shard.clone();
    run_worker_until(&s, registry, async move {
        // After attempt 1: scheduled again, with the delay stored (1–2 s: 2 s halved by jitter at most).
        loop {
            let row = query_one(&probe, "SELECT status, attempts, extract(epoch FROM run_at - now())::float8, error FROM workflow_status WHERE shard_key = $1 AND id = $2", id).await;
            if row.get::<_, String>(0) == "scheduled" {
                assert_eq!(row.get::<_, i32>(1), 1);
                let wait: f64 = row.get(2);
                assert!((0.5..=2.1).contains(&wait), "stored delay {wait}");
                assert_eq!(row.get::<_, String>(3), "boom on attempt 1");
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("boom", |ctx| async move {
        Err(format!("boom on attempt {}", ctx.attempt).into())
    });
    let outcome = run_worker_until(&s, registry, s.client.result(id, Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(outcome, JobOutcome::Dead("boom on attempt 2".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_jobs_are_not_claimable_before_their_time() {
    let s = setup(1, FAST).await;
    let shard = s.set.get(0);
    s.client
        .enqueue(NewJob::new("q", "noop", serde_json::json!({})).delay(Duration::from_millis(1500)))
        .await
        .unwrap();
    assert!(matches!(
        jobs::claim(shard, claim_params("w", 1000)).await.unwrap(),
        Claim::Empty
    ));
    assert_eq!(
        upkeep::promote_due(shard, 10).await.unwrap(),
        0,
        "not due yet"
    );
    // Scheduled jobs stay out of the dequeue index entirely.
    let ready: i64 = shard
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT count(*) FROM workflow_status WHERE status = 'queued'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ready, 0);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(upkeep::promote_due(shard, 10).await.unwrap(), 1);
    assert!(matches!(
        jobs::claim(shard, claim_params("w", 1000)).await.unwrap(),
        Claim::Jobs(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lower_priority_numbers_are_claimed_first() {
    let s = setup(1, FAST).await;
    let low: Vec<NewJob> = (0..5)
        .map(|_| NewJob::new("q", "noop", serde_json::json!({"p": 5})).priority(5))
        .collect();
    let high: Vec<NewJob> = (0..3)
        .map(|_| NewJob::new("q", "noop", serde_json::json!({"p": 1})).priority(1))
        .collect();
    s.client.enqueue_many(low).await.unwrap();
    s.client.enqueue_many(high).await.unwrap();
    let mut params = claim_params("w", 1000);
    params.limit = 3;
    let Claim::Jobs(jobs) = jobs::claim(s.set.get(0), params).await.unwrap() else {
        panic!("no jobs")
    };
    assert!(jobs.iter().all(|j| j.payload["p"] == 1), "{jobs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedup_id_admits_one_unfinished_job_per_queue_across_shards() {
    let s = setup(4, FAST).await;
    let job = || {
        NewJob::new("q", "noop", serde_json::json!({}))
            .dedup("order-7", OnDuplicate::ReturnExisting)
    };
    // Two clients at once, as two processes would.
    let other = Client::from_shards(
        ShardSet::connect(&s.config).unwrap(),
        s.config.limits.clone(),
    );
    let (a, b) = tokio::join!(s.client.enqueue(job()), other.enqueue(job()));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b, "the duplicate returns the existing id");
    let strict =
        NewJob::new("q", "noop", serde_json::json!({})).dedup("order-7", OnDuplicate::Error);
    match s.client.enqueue(strict).await {
        Err(ClientError::Duplicate { existing, .. }) => assert_eq!(existing, a),
        other => panic!("expected a duplicate error, got {other:?}"),
    }
    let total: i64 = {
        let mut n = 0;
        for shard in s.set.all() {
            n += shard
                .client()
                .await
                .unwrap()
                .query_one("SELECT count(*) FROM workflow_status", &[])
                .await
                .unwrap()
                .get::<_, i64>(0);
        }
        n
    };
    assert_eq!(total, 1);
    // Once it finished, the id is free again.
    run_worker_until(
        &s,
        HandlerRegistry::with_builtins(),
        s.client.result(a, Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let again = s.client.enqueue(job()).await.unwrap();
    assert_ne!(again, a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_jobs_never_run_and_running_ones_are_told_and_stop_recording_steps() {
    let s = setup(1, FAST).await;
    let ran = Arc::new(AtomicU32::new(0));
    let mut registry = HandlerRegistry::with_builtins();
    let counter = ran.clone();
    registry.register("loop", move |ctx| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            for i in 0.. {
                match ctx.step(&format!("s{i}"), || async { Ok(i) }).await {
                    Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    Err(e @ StepError::Cancelled(..)) => return Err(e.into()),
                    Err(e) => return Err(e.into()),
                }
            }
            unreachable!()
        }
    });
    let waiting = s
        .client
        .enqueue(NewJob::new("q", "loop", serde_json::json!({})).delay(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(
        s.client.cancel(waiting).await.unwrap().map(|s| s.as_str()),
        Some("cancelled")
    );

    let running = s
        .client
        .enqueue(NewJob::new("q", "loop", serde_json::json!({})))
        .await
        .unwrap();
    let client = s.client.clone();
    let outcome = run_worker_until(&s, registry, async move {
        while client.job(running).await.unwrap().unwrap().status != "running" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            client.cancel(running).await.unwrap().map(|s| s.as_str()),
            Some("running")
        );
        client
            .result(running, Duration::from_secs(30))
            .await
            .unwrap()
    })
    .await;
    assert_eq!(outcome, JobOutcome::Cancelled);
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "only the running job ever ran"
    );
    assert_eq!(
        s.client.job(waiting).await.unwrap().unwrap().status,
        "cancelled"
    );
    // No step was recorded after the cancellation was asked.
    let row = s.set.get(0).client().await.unwrap()
        .query_one("SELECT count(*) FROM workflow_steps st JOIN workflow_status w ON w.id = st.workflow_id \
                    WHERE st.workflow_id = $1 AND st.created_at > w.finished_at", &[&running.id]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_enqueue_exists_only_if_the_transaction_commits() {
    let s = setup(2, FAST).await;
    let routed = s
        .client
        .route(NewJob::new("q", "noop", serde_json::json!({})).ordering_key("acct-1"))
        .unwrap();
    let mut conn = routed.shard().client().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    let rolled_back = routed.insert(&*tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(s.client.job(rolled_back).await.unwrap().is_none());
    let tx = conn.transaction().await.unwrap();
    let committed = routed.insert(&*tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        s.client.job(committed).await.unwrap().unwrap().status,
        "queued"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_old_finished_jobs_and_their_steps_in_bounded_batches() {
    let s = setup(1, FAST).await;
    let shard = s.set.get(0);
    let jobs = (0..30)
        .map(|_| NewJob::new("q", "noop", serde_json::json!({})))
        .collect();
    let ids = s.client.enqueue_many(jobs).await.unwrap();
    let db = shard.client().await.unwrap();
    db.batch_execute("UPDATE workflow_status SET status = 'succeeded', finished_at = now()")
        .await
        .unwrap();
    // Twenty finished two days ago, with a step each; ten just now.
    let old: Vec<i64> = ids[..20].iter().map(|i| i.id).collect();
    db.execute(
        "UPDATE workflow_status SET finished_at = now() - interval '2 days' WHERE id = ANY($1)",
        &[&old],
    )
    .await
    .unwrap();
    db.execute("INSERT INTO workflow_steps (shard_key, workflow_id, step_name) SELECT shard_key, id, 's' FROM workflow_status WHERE id = ANY($1)", &[&old]).await.unwrap();
    let day = Duration::from_secs(86_400);
    assert_eq!(
        upkeep::delete_finished(shard, day, 8).await.unwrap(),
        8,
        "bounded batch"
    );
    assert_eq!(upkeep::delete_finished(shard, day, 8).await.unwrap(), 8);
    assert_eq!(upkeep::delete_finished(shard, day, 8).await.unwrap(), 4);
    assert_eq!(upkeep::delete_finished(shard, day, 8).await.unwrap(), 0);
    let left: i64 = db
        .query_one("SELECT count(*) FROM workflow_status", &[])
        .await
        .unwrap()
        .get(0);
    let steps: i64 = db
        .query_one("SELECT count(*) FROM workflow_steps", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!((left, steps), (10, 0));
}
