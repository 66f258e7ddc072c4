//! Durable sleep: a workflow that sleeps parks (no slot, no lease, no
//! permit), wakes at a time the shard's clock set, keeps that time through
//! a retry, and a cancellation ends it whether it arrives while it sleeps or
//! between its sleep and its parking.

use crate::common;

use common::TestShards;
use shardq::client::QueueLimits;
use shardq::{HandlerRegistry, JobId, JobOutcome, JobStatus, NewJob, Shardq, StepError};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "sleepy";

/// A migrated shard whose worker runs one job at a time and retries a
/// failure after 10-20 ms.
async fn shardq() -> (TestShards, Shardq) {
    let shards = TestShards::databases(1).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nconcurrency = 1\n\
         retry_backoff_min_ms = 10\nretry_backoff_max_ms = 20\n"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    (shards, shardq)
}

/// One job of `handler` on the queue, its payload empty.
async fn enqueue(shardq: &Shardq, handler: &str) -> JobId {
    shardq
        .client()
        .enqueue(NewJob::new(QUEUE, handler, serde_json::json!({})))
        .await
        .unwrap()
}

/// A worker with `handlers`, until the token is cancelled.
fn start_worker(
    shardq: &Shardq,
    handlers: HandlerRegistry,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<shardq::WorkerReport>,
) {
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    (stop, worker)
}

/// Runs a worker with `handlers` until job `id` has finished; its outcome.
async fn run_until_finished(shardq: &Shardq, handlers: HandlerRegistry, id: JobId) -> JobOutcome {
    let (stop, worker) = start_worker(shardq, handlers);
    let outcome = shardq
        .client()
        .result(id, Duration::from_secs(60))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    outcome
}

async fn status(shardq: &Shardq, id: JobId) -> JobStatus {
    shardq
        .client()
        .job(id)
        .await
        .unwrap()
        .expect("the job")
        .status
}

async fn query_one(shardq: &Shardq, sql: &str, id: JobId) -> tokio_postgres::Row {
    let shard = shardq.shards().get(0);
    shard
        .client()
        .await
        .unwrap()
        .query_one(sql, &[&id.shard_key, &id.id])
        .await
        .unwrap()
}

/// While a workflow sleeps, the one executor slot of the only worker and
/// the queue's one permit run other jobs; the wake time is the shard's
/// clock plus the duration, and the workflow runs again no sooner, without
/// having used an attempt, its step before the sleep not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_workflow_holds_no_slot_or_permit_and_wakes_by_the_shards_clock() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    client
        .set_queue_limits(
            QUEUE,
            QueueLimits {
                concurrency: Some(1),
                ..QueueLimits::default()
            },
        )
        .await
        .unwrap();
    let before_runs = Arc::new(Mutex::new(0));
    let mut handlers = HandlerRegistry::new();
    let runs = before_runs.clone();
    handlers.register("nap", move |ctx| {
        let runs = runs.clone();
        async move {
            ctx.step("before", || async {
                *runs.lock().unwrap() += 1;
                Ok(())
            })
            .await?;
            ctx.sleep(Duration::from_secs(3)).await?;
            ctx.step("after", || async { Ok(()) }).await?;
            Ok(serde_json::json!(ctx.attempt))
        }
    });
    handlers.register("quick", |_ctx| async { Ok(serde_json::Value::Null) });
    let nap = enqueue(&shardq, "nap").await;
    let (stop, worker) = start_worker(&shardq, handlers);
    common::wait_until(Duration::from_secs(30), "the workflow parks", || async {
        status(&shardq, nap).await == JobStatus::Scheduled
    })
    .await;
    let quick: Vec<JobId> = client
        .enqueue_many(
            (0..5)
                .map(|_| NewJob::new(QUEUE, "quick", serde_json::json!({})))
                .collect(),
        )
        .await
        .unwrap();
    for &id in &quick {
        client.result(id, Duration::from_secs(30)).await.unwrap();
    }
    let after_recorded = "SELECT count(*) FROM workflow_steps \
        WHERE shard_key = $1 AND workflow_id = $2 AND step_name = 'after'";
    assert_eq!(
        query_one(&shardq, after_recorded, nap)
            .await
            .get::<_, i64>(0),
        0,
        "the quick jobs waited for the sleep: it held the slot or the permit"
    );
    let parked = client.job(nap).await.unwrap().expect("the job");
    assert_eq!(parked.status, JobStatus::Scheduled);
    let run_at = parked.run_at.expect("a wake time");
    assert_eq!(
        parked.waiting_for,
        Some(format!("a durable sleep, until {run_at}")),
        "what `shardq job show` says it waits for"
    );
    let depth = client.depth(QUEUE).await.unwrap().counts;
    assert_eq!(
        (depth.parked, depth.delayed, depth.retrying),
        (1, 0, 0),
        "status and the metrics count it parked, not delayed"
    );

    let outcome = client.result(nap, Duration::from_secs(30)).await.unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(
        outcome,
        JobOutcome::Succeeded(serde_json::json!(1)),
        "woken on its first attempt"
    );
    assert_eq!(
        *before_runs.lock().unwrap(),
        1,
        "the step before the sleep ran once"
    );
    let wake = query_one(
        &shardq,
        "SELECT (s.output->>'wake_at')::timestamptz - s.created_at = interval '3 s', \
                w.started_at >= (s.output->>'wake_at')::timestamptz, w.attempts \
         FROM workflow_steps s JOIN workflow_status w \
             ON w.shard_key = s.shard_key AND w.id = s.workflow_id \
         WHERE s.shard_key = $1 AND s.workflow_id = $2 AND s.step_name = 'shardq:sleep:1'",
        nap,
    )
    .await;
    assert!(
        wake.get::<_, bool>(0),
        "the wake time is the shard's now() + 3 s"
    );
    assert!(wake.get::<_, bool>(1), "it ran again before its wake time");
    assert_eq!(wake.get::<_, i32>(2), 1, "parking used no attempt");
}

/// A workflow that fails after its sleep ended is retried; the retry
/// replays the sleep, which keeps its first wake time (passed): it does
/// not park again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_workflow_keeps_its_first_wake_time() {
    let (_shards, shardq) = shardq().await;
    let calls: Arc<Mutex<Vec<(i32, bool)>>> = Arc::default();
    let mut handlers = HandlerRegistry::new();
    let seen = calls.clone();
    handlers.register("flaky", move |ctx| {
        let seen = seen.clone();
        async move {
            let slept = ctx.sleep(Duration::from_secs(2)).await;
            seen.lock()
                .unwrap()
                .push((ctx.attempt, matches!(slept, Err(StepError::Sleeping(..)))));
            slept?;
            if ctx.attempt == 1 {
                return Err("flaky after waking".into());
            }
            Ok(serde_json::Value::Null)
        }
    });
    let id = enqueue(&shardq, "flaky").await;
    let outcome = run_until_finished(&shardq, handlers, id).await;
    assert_eq!(outcome, JobOutcome::Succeeded(serde_json::Value::Null));
    assert_eq!(
        *calls.lock().unwrap(),
        vec![(1, true), (1, false), (2, false)],
        "parked once, woke on attempt 1, and the retry did not sleep again"
    );
    let sleeps = query_one(
        &shardq,
        "SELECT count(*) FROM workflow_steps \
         WHERE shard_key = $1 AND workflow_id = $2 AND step_name LIKE 'shardq:sleep:%'",
        id,
    )
    .await;
    assert_eq!(sleeps.get::<_, i64>(0), 1);
}

/// A due sleep replayed is a read: it neither locks nor writes the
/// workflow's row (the row's `xmax` is the same before and after it, where
/// a `FOR UPDATE` would leave the locker's transaction id), yet a replay
/// by an attempt that no longer holds the workflow is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_sleep_replays_without_locking_the_workflow() {
    let (_shards, shardq) = shardq().await;
    let xmax_around_replay: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let mut handlers = HandlerRegistry::new();
    let (seen, pool) = (xmax_around_replay.clone(), shardq.shards().get(0).clone());
    handlers.register("nap", move |ctx| {
        let (seen, pool) = (seen.clone(), pool.clone());
        async move {
            let client = pool.client().await?;
            let xmax = || async {
                let row = client
                    .query_one(
                        "SELECT xmax::text FROM workflow_status WHERE shard_key = $1 AND id = $2",
                        &[&ctx.id.shard_key, &ctx.id.id],
                    )
                    .await?;
                Ok::<String, shardq::tokio_postgres::Error>(row.get(0))
            };
            let before = xmax().await?;
            ctx.sleep(Duration::from_millis(200)).await?;
            let after = xmax().await?;
            seen.lock().unwrap().push((before, after));
            Ok(serde_json::Value::Null)
        }
    });
    let id = enqueue(&shardq, "nap").await;
    let outcome = run_until_finished(&shardq, handlers, id).await;
    assert_eq!(outcome, JobOutcome::Succeeded(serde_json::Value::Null));
    let seen = xmax_around_replay.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "one run found the sleep due");
    assert_eq!(seen[0].0, seen[0].1, "the due replay locked the row");

    // The same replay by a claim that does not hold the workflow (a wrong
    // fence): refused, though the sleep is due.
    let shard = shardq.shards().get(0);
    let slept = shardq::store::steps::sleep(
        shard,
        shardq::store::steps::Sleep {
            id,
            name: "shardq:sleep:1",
            duration: Duration::ZERO,
            until: None,
            owner: "nobody",
            fence: 0,
        },
    )
    .await
    .unwrap();
    assert_eq!(slept, shardq::store::steps::Slept::NotHeld);
}

/// Cancelled while it sleeps, a workflow ends cancelled at once and never
/// runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_workflow_cancelled_ends_cancelled_and_never_runs_again() {
    let (_shards, shardq) = shardq().await;
    let runs = Arc::new(Mutex::new(0));
    let mut handlers = HandlerRegistry::new();
    let counted = runs.clone();
    handlers.register("long_nap", move |ctx| {
        let counted = counted.clone();
        async move {
            *counted.lock().unwrap() += 1;
            ctx.sleep(Duration::from_secs(2)).await?;
            Ok(serde_json::Value::Null)
        }
    });
    let id = enqueue(&shardq, "long_nap").await;
    let (stop, worker) = start_worker(&shardq, handlers);
    common::wait_until(Duration::from_secs(30), "the workflow parks", || async {
        status(&shardq, id).await == JobStatus::Scheduled
    })
    .await;
    assert_eq!(
        shardq.client().cancel(id).await.unwrap(),
        Some(JobStatus::Cancelled)
    );
    // Past the wake time: a cancelled workflow is not woken.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(status(&shardq, id).await, JobStatus::Cancelled);
    assert_eq!(*runs.lock().unwrap(), 1);
}

/// The cancellation arrives between the sleep (which recorded its wake
/// time while the workflow still ran) and the outcome that parks it: the
/// parking writes it cancelled, never scheduled to run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancellation_between_the_sleep_and_its_parking_ends_the_workflow() {
    let (_shards, shardq) = shardq().await;
    let slept = Arc::new(Notify::new());
    let go_on = Arc::new(Notify::new());
    let mut handlers = HandlerRegistry::new();
    let (signal, wait) = (slept.clone(), go_on.clone());
    handlers.register("nap", move |ctx| {
        let (signal, wait) = (signal.clone(), wait.clone());
        async move {
            let result = ctx.sleep(Duration::from_secs(60)).await;
            signal.notify_one();
            wait.notified().await;
            result?;
            Ok(serde_json::Value::Null)
        }
    });
    let id = enqueue(&shardq, "nap").await;
    let (stop, worker) = start_worker(&shardq, handlers);
    tokio::time::timeout(Duration::from_secs(30), slept.notified())
        .await
        .expect("the handler reaches its sleep");
    assert_eq!(status(&shardq, id).await, JobStatus::Running);
    assert_eq!(
        shardq.client().cancel(id).await.unwrap(),
        Some(JobStatus::Running),
        "a running workflow's cancellation is asked"
    );
    go_on.notify_one();
    let outcome = shardq
        .client()
        .result(id, Duration::from_secs(30))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Cancelled);
    let info = shardq.client().job(id).await.unwrap().expect("the job");
    assert_eq!(info.error.as_deref(), Some("cancelled while it waited"));
}

/// A keyed workflow that sleeps keeps its key: the key's later job (claimed
/// in the same run) runs only after the workflow woke and finished, so
/// per-key order holds across the park.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_keyed_workflow_holds_back_its_keys_later_jobs() {
    let (_shards, shardq) = shardq().await;
    let events: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let mut handlers = HandlerRegistry::new();
    let seen = events.clone();
    handlers.register("nap", move |ctx| {
        let seen = seen.clone();
        async move {
            let slept = ctx.sleep(Duration::from_secs(2)).await;
            seen.lock().unwrap().push(match slept {
                Ok(()) => "nap woke",
                Err(_) => "nap parked",
            });
            slept?;
            Ok(serde_json::Value::Null)
        }
    });
    let seen = events.clone();
    handlers.register("quick", move |_ctx| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push("later job ran");
            Ok(serde_json::Value::Null)
        }
    });
    let client = shardq.client();
    let ids = client
        .enqueue_many(vec![
            NewJob::new(QUEUE, "nap", serde_json::json!({})).ordering_key("k"),
            NewJob::new(QUEUE, "quick", serde_json::json!({})).ordering_key("k"),
        ])
        .await
        .unwrap();
    let (stop, worker) = start_worker(&shardq, handlers);
    for &id in &ids {
        client.result(id, Duration::from_secs(30)).await.unwrap();
    }
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(
        *events.lock().unwrap(),
        vec!["nap parked", "nap woke", "later job ran"]
    );
}

/// The crash test's worker process: its workflow records its sleep, then
/// hangs before the park is written, until the test kills the process.
/// Does nothing in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_sleep_crashing_worker_process() {
    let Some(config) = common::child_test::config_as("sleeper") else {
        return;
    };
    let shards = shardq::ShardSet::connect(&config).unwrap();
    let mut handlers = HandlerRegistry::new();
    handlers.register("nap", |ctx| async move {
        if ctx.sleep(Duration::from_secs(4)).await.is_err() {
            std::future::pending::<()>().await;
        }
        Ok(serde_json::Value::Null)
    });
    shardq::Worker::new(config, shards, handlers)
        .run(CancellationToken::new())
        .await;
}

/// A worker process SIGKILLed after the sleep recorded its wake time and
/// before the park was written: the workflow comes back by lease expiry,
/// runs again, parks until the wake time first recorded (not a new one),
/// and wakes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_between_its_sleep_and_the_park_wakes_the_workflow_once_on_time() {
    if common::child_test::is_child() {
        return;
    }
    let shards = TestShards::databases(1).await;
    let toml = shards.toml(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nlease_ms = 2000\n"
    ));
    let shardq = Shardq::connect(shardq::Config::from_toml(&toml).unwrap()).unwrap();
    shardq.migrate().await.unwrap();
    let id = enqueue(&shardq, "nap").await;
    let recorded = "SELECT (output->>'wake_at')::timestamptz::text FROM workflow_steps \
        WHERE shard_key = $1 AND workflow_id = $2 AND step_name = 'shardq:sleep:1'";
    let shard = shardq.shards().get(0);
    let wake_at = || async {
        shard
            .client()
            .await
            .unwrap()
            .query_opt(recorded, &[&id.shard_key, &id.id])
            .await
            .unwrap()
            .map(|r| r.get::<_, String>(0))
    };
    let mut child = common::child_test::spawn(
        "durable_sleep::durable_sleep_crashing_worker_process",
        "sleeper",
        &toml,
    );
    common::wait_until(Duration::from_secs(30), "the sleep is recorded", || async {
        wake_at().await.is_some()
    })
    .await;
    let first_wake = wake_at().await.unwrap();
    child.kill().await.unwrap();
    assert_eq!(status(&shardq, id).await, JobStatus::Running, "not parked");

    let woke = Arc::new(Mutex::new(0));
    let mut handlers = HandlerRegistry::new();
    let counted = woke.clone();
    handlers.register("nap", move |ctx| {
        let counted = counted.clone();
        async move {
            ctx.sleep(Duration::from_secs(4)).await?;
            *counted.lock().unwrap() += 1;
            Ok(serde_json::Value::Null)
        }
    });
    let outcome = run_until_finished(&shardq, handlers, id).await;
    assert_eq!(outcome, JobOutcome::Succeeded(serde_json::Value::Null));
    assert_eq!(*woke.lock().unwrap(), 1, "woke once");
    assert_eq!(
        wake_at().await,
        Some(first_wake.clone()),
        "the wake time is the first one"
    );
    let row = shard
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT started_at >= $3::text::timestamptz FROM workflow_status \
             WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id, &first_wake],
        )
        .await
        .unwrap();
    assert!(
        row.get::<_, bool>(0),
        "the run that woke started before {first_wake}"
    );
}

/// Twenty workflows parked in a 4 s sleep while their shard's server
/// crashes (immediate stop) and starts again: each wakes once (two runs:
/// the one that parked, the one that woke), never before its recorded wake
/// time, and within seconds of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeping_workflows_wake_once_on_time_across_a_shard_crash() {
    let shards = TestShards::servers(1).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nconcurrency = 8\nmaintenance_interval_ms = 100\n"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    let runs: Arc<Mutex<std::collections::HashMap<JobId, u32>>> = Arc::default();
    let mut handlers = HandlerRegistry::new();
    let counted = runs.clone();
    handlers.register("nap", move |ctx| {
        let counted = counted.clone();
        async move {
            *counted.lock().unwrap().entry(ctx.id).or_default() += 1;
            ctx.sleep(Duration::from_secs(4)).await?;
            Ok(serde_json::Value::Null)
        }
    });
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(enqueue(&shardq, "nap").await);
    }
    let (stop, worker) = start_worker(&shardq, handlers);
    let parked = "SELECT count(*) FROM workflow_status WHERE status = 'scheduled' AND parked";
    let all_parked = async {
        loop {
            let n: i64 = shardq
                .shards()
                .get(0)
                .client()
                .await
                .unwrap()
                .query_one(parked, &[])
                .await
                .unwrap()
                .get(0);
            if n == 20 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all_parked)
        .await
        .expect("all twenty park");
    shards.servers[0]
        .stop(shardq_local::StopMode::Immediate)
        .expect("crash the server");
    tokio::time::sleep(Duration::from_millis(500)).await;
    shards.servers[0].start_again().expect("start it again");
    for &id in &ids {
        let outcome = shardq
            .client()
            .result(id, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(outcome, JobOutcome::Succeeded(serde_json::Value::Null));
    }
    stop.cancel();
    worker.await.unwrap();
    let runs = runs.lock().unwrap().clone();
    for id in &ids {
        assert_eq!(runs.get(id), Some(&2), "{id}: parked once, woke once");
    }
    let (early, latest): (i64, f64) = {
        let row = shardq
            .shards()
            .get(0)
            .client()
            .await
            .unwrap()
            .query_one(
                "SELECT count(*) FILTER (WHERE w.started_at < (s.output->>'wake_at')::timestamptz), \
                    max(extract(epoch FROM w.started_at - (s.output->>'wake_at')::timestamptz))::float8 \
                 FROM workflow_status w JOIN workflow_steps s \
                     ON s.shard_key = w.shard_key AND s.workflow_id = w.id \
                 WHERE s.step_name = 'shardq:sleep:1'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(early, 0, "none woke before its wake time");
    assert!(latest < 20.0, "the latest woke {latest} s late");
}
