//! Debounce (`NewJob::debounce`): a burst of enqueues with one key runs
//! once, with the last committed payload, `period` after the last enqueue
//! and never later than `max_wait` after the first (the shard's clock); an
//! enqueue while the run is queued or running starts the next run; the
//! promotion racing an enqueue, driven statement by statement.

use crate::common;

use common::TestShards;
use serde_json::{json, Value};
use shardq::job::InvalidJob;
use shardq::store::{locks, sql, upkeep};
use shardq::tokio_postgres::types::Type;
use shardq::{ClientError, HandlerRegistry, JobId, NewJob, Shardq};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "debounced";

/// A migrated shard; no worker runs until a test starts one (so nothing
/// promotes behind a test's back).
async fn shardq() -> (TestShards, Shardq) {
    shardq_with("").await
}

async fn shardq_with(worker: &str) -> (TestShards, Shardq) {
    let shards = TestShards::databases(1).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nconcurrency = 4\n{worker}"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    (shards, shardq)
}

fn debounced(key: &str, payload: Value, period: Duration, max_wait: Duration) -> NewJob {
    NewJob::new(QUEUE, "sync", payload).debounce(key, period, max_wait)
}

/// The payloads each run of `sync` saw, in start order.
type Runs = Arc<Mutex<Vec<(JobId, Value)>>>;

/// A handler `sync` that records its runs, and (`gate`) waits for a permit
/// before it returns.
fn recording(gate: Option<Arc<Semaphore>>) -> (HandlerRegistry, Runs) {
    let runs: Runs = Arc::default();
    let mut handlers = HandlerRegistry::new();
    let seen = runs.clone();
    handlers.register("sync", move |ctx| {
        let (seen, gate) = (seen.clone(), gate.clone());
        async move {
            seen.lock().unwrap().push((ctx.id, ctx.payload.clone()));
            if let Some(gate) = gate {
                gate.acquire().await.unwrap().forget();
            }
            Ok(Value::Null)
        }
    });
    (handlers, runs)
}

fn start_worker(shardq: &Shardq, handlers: HandlerRegistry) -> CancellationToken {
    let stop = CancellationToken::new();
    tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    stop
}

/// The queue's rows: (id, status, payload, debounce_key), by id.
async fn rows(shardq: &Shardq) -> Vec<(i64, String, Value, Option<String>)> {
    let db = shardq.shards().get(0).client().await.unwrap();
    db.query(
        "SELECT id, status, payload, debounce_key FROM workflow_status \
         WHERE queue = $1 ORDER BY id",
        &[&QUEUE],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

async fn run_count(runs: &Runs) -> usize {
    runs.lock().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_1000_enqueues_from_concurrent_tasks_runs_once_with_the_last_payload() {
    let (_shards, shardq) = shardq().await;
    let (handlers, runs) = recording(None);
    let stop = start_worker(&shardq, handlers);
    let (period, max_wait) = (Duration::from_secs(3), Duration::from_secs(120));
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let client = shardq.client();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for i in 0..125 {
                    let payload = json!({"task": task, "n": i});
                    ids.push(
                        client
                            .enqueue(debounced("k", payload, period, max_wait))
                            .await
                            .unwrap(),
                    );
                }
                ids
            })
        })
        .collect();
    let mut ids = Vec::new();
    for task in tasks {
        ids.extend(task.await.unwrap());
    }
    assert_eq!(ids.len(), 1000);
    let rows_after_burst = rows(&shardq).await;
    assert_eq!(
        rows_after_burst.len(),
        1,
        "one pending run: {rows_after_burst:?}"
    );
    let (run_id, status, last_payload, key) = rows_after_burst[0].clone();
    assert_eq!(status, "scheduled", "not run during the burst");
    assert_eq!(key.as_deref(), Some("k"));
    assert!(
        ids.iter().all(|id| id.id == run_id),
        "every enqueue joined it"
    );
    assert_eq!(run_count(&runs).await, 0, "nothing ran during the burst");

    common::wait_until(Duration::from_secs(30), "the run", || async {
        run_count(&runs).await >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 1, "one run: {runs:?}");
    assert_eq!(runs[0].1, last_payload, "with the payload the burst left");
}

/// The payload is the last to commit, not the last by a writer's clock,
/// and a join never moves the run earlier: an enqueue whose transaction
/// began first but commits last wins, and the start stays `period` after
/// the enqueue with the later clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_committed_enqueue_wins_whatever_its_clock() {
    let (_shards, shardq) = shardq().await;
    let shard = shardq.shards().get(0).clone();
    let period = Duration::from_secs(60);
    let job_early = debounced("k", json!("began first"), period, 10 * period);
    let job_late = debounced("k", json!("began second"), period, 10 * period);
    let mut a = shard.client().await.unwrap();
    let mut b = shard.client().await.unwrap();
    let ta = a.transaction().await.unwrap();
    ta.execute("SELECT 1", &[]).await.unwrap(); // now() fixed here
    tokio::time::sleep(Duration::from_millis(200)).await;
    let tb = b.transaction().await.unwrap();
    insert_debounced(&tb, &job_late, 2).await;
    tb.commit().await.unwrap();
    insert_debounced(&ta, &job_early, 1).await;
    ta.commit().await.unwrap();

    let db = shard.client().await.unwrap();
    let row = db
        .query_one(
            "SELECT payload, count(*) OVER () AS n, \
                 extract(epoch FROM run_at - created_at)::float8 AS after_created \
             FROM workflow_status WHERE queue = $1",
            &[&QUEUE],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>("n"), 1);
    assert_eq!(
        row.get::<_, Value>("payload"),
        json!("began first"),
        "last to commit"
    );
    let after: f64 = row.get("after_created");
    assert!(
        after >= 60.0,
        "the start is 60 s after the later clock's enqueue, not moved earlier: {after}"
    );
}

/// `JOB_INSERT_DEBOUNCED` for one job (reserved id `id`) inside `tx`.
async fn insert_debounced(tx: &shardq::tokio_postgres::Transaction<'_>, job: &NewJob, id: i64) {
    let d = job.debounce.clone().unwrap();
    let shard_key = shardq::router::shard_key_for(&d.key);
    let epoch: Option<i32> = None;
    tx.query_typed(
        sql::JOB_INSERT_DEBOUNCED,
        &[
            (&vec![id], Type::INT8_ARRAY),
            (&vec![shard_key], Type::INT4_ARRAY),
            (&vec![job.queue.as_str()], Type::TEXT_ARRAY),
            (&vec![job.handler.as_str()], Type::TEXT_ARRAY),
            (&vec![job.priority], Type::INT4_ARRAY),
            (&vec![&job.payload], Type::JSONB_ARRAY),
            (&vec![d.period.as_millis() as i64], Type::INT8_ARRAY),
            (&vec![d.max_wait.as_millis() as i64], Type::INT8_ARRAY),
            (&epoch, Type::INT4),
            (&vec![3_i32], Type::INT4_ARRAY),
            (&vec![d.key.as_str()], Type::TEXT_ARRAY),
            (
                &vec![job.timeout.map(|t| t.as_millis() as i64)],
                Type::INT8_ARRAY,
            ),
        ],
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_enqueue_during_the_run_schedules_exactly_one_more_run() {
    let (_shards, shardq) = shardq().await;
    let gate = Arc::new(Semaphore::new(0));
    let (handlers, runs) = recording(Some(gate.clone()));
    let stop = start_worker(&shardq, handlers);
    let client = shardq.client();
    let (period, max_wait) = (Duration::from_millis(200), Duration::from_secs(30));
    let first = client
        .enqueue(debounced("k", json!(1), period, max_wait))
        .await
        .unwrap();
    common::wait_until(Duration::from_secs(30), "the first run", || async {
        run_count(&runs).await == 1
    })
    .await;
    let mut during = Vec::new();
    for n in 2..=6 {
        during.push(
            client
                .enqueue(debounced("k", json!(n), period, max_wait))
                .await
                .unwrap(),
        );
    }
    assert!(during.iter().all(|id| *id == during[0]), "{during:?}");
    assert_ne!(during[0], first, "not swallowed by the running run");
    gate.add_permits(2);
    common::wait_until(Duration::from_secs(30), "the second run", || async {
        run_count(&runs).await == 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let runs = runs.lock().unwrap().clone();
    assert_eq!(
        runs,
        vec![(first, json!(1)), (during[0], json!(6))],
        "one more run, with the last payload"
    );
}

/// A steady stream (an enqueue every period/2, for 3 x max_wait) never
/// lets `period` pass, yet runs happen, each starting no later than
/// `max_wait` after its first enqueue by the shard's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_wait_bounds_a_steady_stream() {
    let (_shards, shardq) = shardq().await;
    let (handlers, runs) = recording(None);
    let stop = start_worker(&shardq, handlers);
    let client = shardq.client();
    let (period, max_wait) = (Duration::from_millis(600), Duration::from_millis(1800));
    let started = std::time::Instant::now();
    let mut n = 0;
    while started.elapsed() < 3 * max_wait {
        client
            .enqueue(debounced("k", json!(n), period, max_wait))
            .await
            .unwrap();
        n += 1;
        tokio::time::sleep(period / 2).await;
    }
    let during_stream = run_count(&runs).await;
    assert!(
        during_stream >= 2,
        "runs while the stream went on: {during_stream}"
    );
    common::wait_until(Duration::from_secs(30), "the last run", || async {
        let pending = rows(&shardq).await;
        pending.iter().all(|r| r.1 == "succeeded")
    })
    .await;
    stop.cancel();
    let db = shardq.shards().get(0).client().await.unwrap();
    for row in db
        .query(
            "SELECT id, run_at <= created_at + $2::bigint * interval '1 millisecond' AS due_in_time, \
                 extract(epoch FROM started_at - created_at)::float8 AS waited \
             FROM workflow_status WHERE queue = $1 ORDER BY id",
            &[&QUEUE, &(max_wait.as_millis() as i64)],
        )
        .await
        .unwrap()
    {
        let (id, due_in_time, waited): (i64, bool, f64) = (row.get(0), row.get(1), row.get(2));
        assert!(due_in_time, "run {id} was due within max_wait of its first enqueue");
        // The due time plus the promotion's pass and a claim.
        assert!(
            waited <= max_wait.as_secs_f64() + 1.5,
            "run {id} started {waited} s after its first enqueue"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_keys_do_not_interfere() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let (period, max_wait) = (Duration::from_millis(300), Duration::from_secs(30));
    let mut ids = Vec::new();
    for n in 0..10 {
        for key in ["a", "b"] {
            ids.push(
                client
                    .enqueue(debounced(key, json!(format!("{key}{n}")), period, max_wait))
                    .await
                    .unwrap(),
            );
        }
    }
    let (handlers, runs) = recording(None);
    let stop = start_worker(&shardq, handlers);
    common::wait_until(Duration::from_secs(30), "both runs", || async {
        run_count(&runs).await >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let mut runs = runs.lock().unwrap().clone();
    runs.sort_by_key(|(id, _)| *id);
    assert_eq!(
        runs,
        vec![(ids[0], json!("a9")), (ids[1], json!("b9"))],
        "one run per key, each with its own last payload"
    );
}

/// Runs the promotion of due jobs (`JOB_PROMOTE_DUE`) in `tx`; how many
/// it queued.
async fn promote(tx: &shardq::tokio_postgres::Transaction<'_>) -> usize {
    tx.query_typed(
        sql::JOB_PROMOTE_DUE,
        &[
            (&locks::maintenance_class(), Type::INT4),
            (&locks::PROMOTION_SLOT, Type::INT4),
            (&100_i64, Type::INT8),
            (&upkeep::KEY_LOCKS_PER_STATEMENT, Type::INT8),
        ],
    )
    .await
    .unwrap()
    .len()
}

/// A pending run of key `k`, made due now (its latest start an hour away).
async fn due_pending_run(shardq: &Shardq) -> JobId {
    let id = shardq
        .client()
        .enqueue(debounced(
            "k",
            json!("first"),
            Duration::from_secs(60),
            Duration::from_secs(3600),
        ))
        .await
        .unwrap();
    shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET run_at = now() - interval '1 second' \
             WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap();
    id
}

/// The promotion queues the pending run and has not committed when an
/// enqueue of the key arrives: the enqueue waits on the row, then (the
/// promotion committed, the row out of the key's index) writes the key's
/// next run, not swallowed into the one now queued. Rolled back instead,
/// the enqueue joins the run still pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_enqueue_racing_an_uncommitted_promotion_waits_then_starts_the_next_run() {
    let (_shards, shardq) = shardq().await;
    let shard = shardq.shards().get(0).clone();
    let pending = due_pending_run(&shardq).await;
    let mut db = shard.client().await.unwrap();
    let (period, max_wait) = (Duration::from_secs(60), Duration::from_secs(3600));

    // Committed.
    let tx = db.transaction().await.unwrap();
    assert_eq!(promote(&tx).await, 1, "the promotion queues it");
    let client = shardq.client();
    let enqueue = tokio::spawn(async move {
        client
            .enqueue(debounced("k", json!("second"), period, max_wait))
            .await
    });
    common::until_lock_wait(
        shardq.shards().get(0),
        "the enqueue waits for the promotion",
    )
    .await;
    assert!(!enqueue.is_finished());
    tx.commit().await.unwrap();
    let next = enqueue.await.unwrap().unwrap();
    assert_ne!(next, pending, "a new run, not the queued one");
    assert_eq!(
        rows(&shardq).await,
        vec![
            (
                pending.id,
                "queued".into(),
                json!("first"),
                Some("k".into())
            ),
            (
                next.id,
                "scheduled".into(),
                json!("second"),
                Some("k".into())
            ),
        ]
    );

    // Rolled back: the run stays pending and the enqueue joins it.
    db.execute(
        "UPDATE workflow_status SET run_at = now() - interval '1 second' \
         WHERE shard_key = $1 AND id = $2",
        &[&next.shard_key, &next.id],
    )
    .await
    .unwrap();
    let tx = db.transaction().await.unwrap();
    assert_eq!(promote(&tx).await, 1);
    let client = shardq.client();
    let enqueue = tokio::spawn(async move {
        client
            .enqueue(debounced("k", json!("third"), period, max_wait))
            .await
    });
    common::until_lock_wait(
        shardq.shards().get(0),
        "the enqueue waits for the promotion",
    )
    .await;
    tx.rollback().await.unwrap();
    assert_eq!(
        enqueue.await.unwrap().unwrap(),
        next,
        "joined the pending run"
    );
    assert_eq!(rows(&shardq).await[1].1, "scheduled");
    assert_eq!(rows(&shardq).await[1].2, json!("third"));
}

/// An enqueue that joined the due pending run and has not committed: the
/// promotion skips the row it holds (it never waits), and once the enqueue
/// commits the run is no longer due (pushed `period` out): the next pass
/// leaves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_promotion_racing_an_uncommitted_enqueue_skips_the_run_it_pushes_out() {
    let (_shards, shardq) = shardq().await;
    let shard = shardq.shards().get(0).clone();
    let pending = due_pending_run(&shardq).await;
    let mut a = shard.client().await.unwrap();
    let mut b = shard.client().await.unwrap();
    let te = a.transaction().await.unwrap();
    let job = debounced(
        "k",
        json!("later"),
        Duration::from_secs(60),
        Duration::from_secs(3600),
    );
    insert_debounced(&te, &job, 1_000_000).await;
    let tp = b.transaction().await.unwrap();
    assert_eq!(
        promote(&tp).await,
        0,
        "the joined row is skipped, not waited for"
    );
    tp.commit().await.unwrap();
    te.commit().await.unwrap();
    let tp = b.transaction().await.unwrap();
    assert_eq!(promote(&tp).await, 0, "no longer due");
    tp.commit().await.unwrap();
    assert_eq!(
        rows(&shardq).await,
        vec![(
            pending.id,
            "scheduled".into(),
            json!("later"),
            Some("k".into())
        )]
    );
}

/// One batch with several jobs of one key: the last of them is written
/// (one statement cannot join a row twice), and all get the run's id;
/// a batch joins a run pending before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_duplicate_keys_keeps_the_last_of_each() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let (p, w) = (Duration::from_secs(60), Duration::from_secs(600));
    let before = client
        .enqueue(debounced("b", json!("b0"), p, w))
        .await
        .unwrap();
    let ids = client
        .enqueue_many(vec![
            debounced("a", json!("a1"), p, w),
            debounced("b", json!("b1"), p, w),
            debounced("a", json!("a2"), p, w),
            NewJob::new(QUEUE, "plain", json!("plain")),
            debounced("a", json!("a3"), p, w),
            debounced("b", json!("b2"), p, w),
        ])
        .await
        .unwrap();
    assert_eq!(ids[0], ids[2]);
    assert_eq!(ids[0], ids[4]);
    assert_eq!(ids[1], before, "joined the run pending before the batch");
    assert_eq!(ids[5], before);
    let rows = rows(&shardq).await;
    let pending: Vec<(i64, Value)> = rows
        .iter()
        .filter(|r| r.3.is_some())
        .map(|r| (r.0, r.2.clone()))
        .collect();
    assert_eq!(
        pending,
        vec![(before.id, json!("b2")), (ids[0].id, json!("a3"))],
        "{rows:?}"
    );
    assert_eq!(rows.len(), 3, "and the plain job: {rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_debounces_are_refused_before_anything_is_written() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let s = Duration::from_secs(1);
    let cases = [
        (debounced("", json!(1), s, s), "debounce key name is empty"),
        (debounced("k", json!(1), Duration::ZERO, s), "at least 1 ms"),
        (
            debounced("k", json!(1), 2 * s, s),
            "max_wait at least the period",
        ),
        (
            debounced("k", json!(1), s, s).ordering_key("o"),
            "cannot also have an ordering key",
        ),
        (
            debounced("k", json!(1), s, s).delay(s),
            "cannot also have a delay",
        ),
    ];
    for (job, says) in cases {
        let batch = vec![debounced("ok", json!(0), s, s), job];
        match client.enqueue_many(batch).await {
            Err(ClientError::Invalid { index: 1, reason }) => {
                assert!(reason.to_string().contains(says), "{reason}");
            }
            other => panic!("{says}: {other:?}"),
        }
    }
    match client.route(debounced("k", json!(1), s, s)) {
        Err(ClientError::Invalid {
            reason: InvalidJob::DebounceInTransaction,
            ..
        }) => {}
        other => panic!("transactional: {other:?}"),
    }
    assert!(rows(&shardq).await.is_empty(), "nothing written");
}

/// The crash test's worker process: its debounced job hangs until the test
/// kills the process. Does nothing in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debounce_crashing_worker_process() {
    let Some(config) = common::child_test::config_as("debounce") else {
        return;
    };
    let shards = shardq::ShardSet::connect(&config).unwrap();
    let mut handlers = HandlerRegistry::new();
    handlers.register("sync", |_ctx| async move {
        std::future::pending::<()>().await;
        Ok(Value::Null)
    });
    shardq::Worker::new(config, shards, handlers)
        .run(CancellationToken::new())
        .await;
}

/// A debounced job whose worker process is SIGKILLed mid-run is an
/// ordinary job once queued: it comes back by lease expiry and runs to
/// the end once, with its payload; an enqueue of the key meanwhile is the
/// next run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debounced_job_survives_a_worker_killed_mid_run() {
    if common::child_test::is_child() {
        return;
    }
    let shards = TestShards::databases(1).await;
    let toml = shards.toml(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nlease_ms = 2000\n"
    ));
    let shardq = Shardq::connect(shardq::Config::from_toml(&toml).unwrap()).unwrap();
    shardq.migrate().await.unwrap();
    let client = shardq.client();
    let (period, max_wait) = (Duration::from_millis(100), Duration::from_secs(30));
    let id = client
        .enqueue(debounced("k", json!("crash"), period, max_wait))
        .await
        .unwrap();
    let mut child = common::child_test::spawn(
        "debounce::debounce_crashing_worker_process",
        "debounce",
        &toml,
    );
    common::wait_until(Duration::from_secs(30), "the run starts", || async {
        rows(&shardq).await[0].1 == "running"
    })
    .await;
    child.kill().await.unwrap();
    let next = client
        .enqueue(debounced("k", json!("after"), period, max_wait))
        .await
        .unwrap();
    assert_ne!(next, id, "the running job is not joined");

    let (handlers, runs) = recording(None);
    let stop = start_worker(&shardq, handlers);
    for job in [id, next] {
        let outcome = client.result(job, Duration::from_secs(60)).await.unwrap();
        assert_eq!(outcome, shardq::JobOutcome::Succeeded(Value::Null));
    }
    stop.cancel();
    let mut runs = runs.lock().unwrap().clone();
    runs.sort_by_key(|(job, _)| *job);
    assert_eq!(runs, vec![(id, json!("crash")), (next, json!("after"))]);
}

/// A run that fails is retried (`scheduled` again) while its key's next
/// run is pending: the retry is an ordinary job (the promotion cleared its
/// `debounce_until`), so it neither meets the pending run in the key's
/// index nor joins it; both run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_run_retries_beside_its_keys_next_pending_run() {
    let (_shards, shardq) =
        shardq_with("retry_backoff_min_ms = 10\nretry_backoff_max_ms = 20\n").await;
    let gate = Arc::new(Semaphore::new(0));
    let attempts: Arc<Mutex<Vec<(JobId, i32)>>> = Arc::default();
    let mut handlers = HandlerRegistry::new();
    let (seen, wait) = (attempts.clone(), gate.clone());
    handlers.register("sync", move |ctx| {
        let (seen, wait) = (seen.clone(), wait.clone());
        async move {
            seen.lock().unwrap().push((ctx.id, ctx.attempt));
            if ctx.attempt == 1 && ctx.payload == json!("first") {
                wait.acquire().await.unwrap().forget();
                return Err("first attempt fails".into());
            }
            Ok(Value::Null)
        }
    });
    let stop = start_worker(&shardq, handlers);
    let client = shardq.client();
    let first = client
        .enqueue(debounced(
            "k",
            json!("first"),
            Duration::from_millis(50),
            Duration::from_secs(5),
        ))
        .await
        .unwrap();
    common::wait_until(Duration::from_secs(30), "the first run", || async {
        !attempts.lock().unwrap().is_empty()
    })
    .await;
    let next = client
        .enqueue(debounced(
            "k",
            json!("next"),
            Duration::from_secs(3600),
            Duration::from_secs(7200),
        ))
        .await
        .unwrap();
    assert_ne!(next, first);
    gate.add_permits(1);
    let outcome = client.result(first, Duration::from_secs(30)).await.unwrap();
    stop.cancel();
    assert_eq!(outcome, shardq::JobOutcome::Succeeded(Value::Null));
    assert_eq!(*attempts.lock().unwrap(), vec![(first, 1), (first, 2)]);
    assert_eq!(
        rows(&shardq).await,
        vec![
            (
                first.id,
                "succeeded".into(),
                json!("first"),
                Some("k".into())
            ),
            (next.id, "scheduled".into(), json!("next"), Some("k".into())),
        ],
        "the next run still pending, untouched"
    );
}

/// A cancelled pending run is not joined: the next enqueue of the key is a
/// new run. Retried by hand, the cancelled one comes back as an ordinary
/// job (not the key's pending run), beside the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_pending_run_is_not_joined_and_comes_back_as_an_ordinary_job() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let (p, w) = (Duration::from_secs(60), Duration::from_secs(600));
    let cancelled = client
        .enqueue(debounced("k", json!("cancelled"), p, w))
        .await
        .unwrap();
    client.cancel(cancelled).await.unwrap();
    let next = client
        .enqueue(debounced("k", json!("next"), p, w))
        .await
        .unwrap();
    assert_ne!(next, cancelled);
    assert!(client.retry(cancelled).await.unwrap(), "retried");
    let again = client
        .enqueue(debounced("k", json!("joins next"), p, w))
        .await
        .unwrap();
    assert_eq!(again, next, "the pending run is still the new one");
    let db = shardq.shards().get(0).client().await.unwrap();
    let pending: Vec<(i64, String, Value, bool)> = db
        .query(
            "SELECT id, status, payload, debounce_until IS NOT NULL FROM workflow_status \
             WHERE queue = $1 ORDER BY id",
            &[&QUEUE],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        pending,
        vec![
            (cancelled.id, "queued".into(), json!("cancelled"), false),
            (next.id, "scheduled".into(), json!("joins next"), true),
        ]
    );
}

/// A retry of a debounced write whose reply was lost: the row it created
/// under its reserved id is found and left alone (no second run, its
/// payload kept even when a later enqueue changed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_write_leaves_the_run_it_created() {
    use shardq::store::jobs::{insert_debounced, reserve_ids, NewRow};
    let (_shards, shardq) = shardq().await;
    let shard = shardq.shards().get(0);
    let (p, w) = (Duration::from_secs(60), Duration::from_secs(600));
    let first = debounced("k", json!("first"), p, w);
    let row = |job| NewRow {
        shard_key: shardq::router::shard_key_for("k"),
        job,
        max_attempts: 3,
    };
    let ids = reserve_ids(shard, 1).await.unwrap();
    let written = insert_debounced(shard, &[row(&first)], &ids, None)
        .await
        .unwrap();
    assert_eq!(written[0].id, ids[0], "a new run under the reserved id");
    let later = debounced("k", json!("later"), p, w);
    let later_ids = reserve_ids(shard, 1).await.unwrap();
    insert_debounced(shard, &[row(&later)], &later_ids, None)
        .await
        .unwrap();
    let again = insert_debounced(shard, &[row(&first)], &ids, None)
        .await
        .unwrap();
    assert_eq!(again, written, "the retry finds its own run");
    assert_eq!(
        rows(&shardq).await,
        vec![(ids[0], "scheduled".into(), json!("later"), Some("k".into()))],
        "not written again, the later payload kept"
    );
}
