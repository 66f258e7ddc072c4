//! Workflow events (`JobContext::set_event`, `Client::get_event`,
//! `JobContext::get_event`) and the SQL functions for other languages
//! (`shardq_send`, `shardq_get_event`): an event is readable before its
//! workflow ends; a get waiting before the set sees it soon after; a
//! timeout is `None`; a replay sets nothing again and a replayed
//! `ctx.get_event` returns what the first run got; an attempt that lost
//! its lease writes nothing (the fence read under the row lock, the race
//! driven statement by statement); an unknown workflow is an error; and a
//! send from SQL delivers, wakes, dedups and refuses as `Client::send`.

use crate::common;

use common::TestShards;
use serde_json::{json, Value};
use shardq::store::events::{self, EventSet, SetEvent};
use shardq::tokio_postgres::error::SqlState;
use shardq::{ClientError, HandlerRegistry, JobId, JobOutcome, JobStatus, NewJob, Shardq};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "events";
/// A queue no worker of these tests serves: its jobs stay unfinished.
const IDLE: &str = "idle";

/// Migrated shards (`n` databases) whose worker runs one job at a time,
/// retries a failure after 10-20 ms, and promotes due jobs once a minute
/// (so only a send wakes a parked recv within a test).
async fn shardq(n: usize) -> (TestShards, Shardq) {
    shardq_with(n, "").await
}

/// [`shardq`] with more `[worker]` settings.
async fn shardq_with(n: usize, worker: &str) -> (TestShards, Shardq) {
    let shards = TestShards::databases(n).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nconcurrency = 1\n\
         retry_backoff_min_ms = 10\nretry_backoff_max_ms = 20\nmaintenance_interval_ms = 60000\n\
         {worker}"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    (shards, shardq)
}

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

async fn enqueue(shardq: &Shardq, queue: &str, handler: &str) -> JobId {
    shardq
        .client()
        .enqueue(NewJob::new(queue, handler, json!({})))
        .await
        .unwrap()
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

/// The shard of `id` (of the test's shards).
fn shard_of(shardq: &Shardq, id: JobId) -> &shardq::shards::Shard {
    shardq.shards().for_key(id.shard_key)
}

/// Every event row of workflow `id`: (key, value).
async fn events_of(shardq: &Shardq, id: JobId) -> Vec<(String, Value)> {
    shard_of(shardq, id)
        .client()
        .await
        .unwrap()
        .query(
            "SELECT key, value FROM workflow_events \
             WHERE shard_key = $1 AND workflow_id = $2 ORDER BY key",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Runs `sql` with `params` on the shard of `id`.
async fn execute(
    shardq: &Shardq,
    id: JobId,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) {
    shard_of(shardq, id)
        .client()
        .await
        .unwrap()
        .execute(sql, params)
        .await
        .unwrap();
}

/// A workflow that publishes its progress, then parks in a recv: its
/// event is read (by the client, and by another workflow's
/// `ctx.get_event`) while it has not ended; a waiting get sees an event
/// set after it began well before its timeout; a get of a key never set
/// returns `None` at its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_read_before_its_workflow_ends_and_a_waiting_get_sees_it() {
    let (_shards, shardq) = shardq(1).await;
    let client = shardq.client();
    let mut handlers = HandlerRegistry::new();
    handlers.register("publisher", |ctx| async move {
        ctx.set_event("stage", json!("charged")).await?;
        ctx.recv("go", Duration::from_secs(600)).await?;
        Ok(Value::Null)
    });
    handlers.register("reader", |ctx| async move {
        let from: JobId = ctx.payload["from"].as_str().unwrap().parse().unwrap();
        let got = ctx
            .get_event(from, "stage", Duration::from_secs(30))
            .await?;
        Ok(json!(got))
    });
    let publisher = enqueue(&shardq, QUEUE, "publisher").await;
    // Waiting before the workflow runs: nothing is set yet.
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            let began = Instant::now();
            let got = client
                .get_event(publisher, "stage", Duration::from_secs(30))
                .await;
            (got, began.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "nothing set yet: it waits");
    let (stop, worker) = start_worker(&shardq, handlers);
    let (got, took) = waiting.await.unwrap();
    assert_eq!(got.unwrap(), Some(json!("charged")));
    assert!(
        took < Duration::from_secs(10),
        "seen soon after the set, not at the timeout: {took:?}"
    );
    common::wait_until(Duration::from_secs(30), "the publisher parks", || async {
        status(&shardq, publisher).await == JobStatus::Scheduled
    })
    .await;
    assert_eq!(
        client
            .get_event(publisher, "stage", Duration::ZERO)
            .await
            .unwrap(),
        Some(json!("charged")),
        "readable while its workflow has not ended"
    );
    let reader = client
        .enqueue(NewJob::new(
            QUEUE,
            "reader",
            json!({ "from": publisher.to_string() }),
        ))
        .await
        .unwrap();
    let outcome = client.result(reader, Duration::from_secs(30)).await;
    assert_eq!(outcome.unwrap(), JobOutcome::Succeeded(json!("charged")));

    let began = Instant::now();
    let never = client
        .get_event(publisher, "never", Duration::from_millis(400))
        .await
        .unwrap();
    assert_eq!(never, None, "not set: None at the timeout");
    assert!(began.elapsed() >= Duration::from_millis(400));
    stop.cancel();
    worker.await.unwrap();
}

/// A workflow sets a key twice, then fails; its retry replays both
/// set_events and writes nothing (the value keeps the first attempt's
/// second set: the last in code order, not set again). Another workflow's
/// `ctx.get_event` (a value, and a timeout's `None`) fails after reading;
/// its retry returns what the first attempt got although the events
/// changed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_sets_nothing_again_and_a_replayed_get_returns_what_it_got() {
    let (_shards, shardq) = shardq(1).await;
    let client = shardq.client();
    let mut handlers = HandlerRegistry::new();
    handlers.register("twice", |ctx| async move {
        ctx.set_event("k", json!({"n": 1, "attempt": ctx.attempt}))
            .await?;
        ctx.set_event("k", json!({"n": 2, "attempt": ctx.attempt}))
            .await?;
        if ctx.attempt == 1 {
            return Err("failed after setting".into());
        }
        Ok(Value::Null)
    });
    let setter = enqueue(&shardq, QUEUE, "twice").await;
    let (stop, worker) = start_worker(&shardq, handlers);
    let outcome = client.result(setter, Duration::from_secs(30)).await;
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome.unwrap(), JobOutcome::Succeeded(Value::Null));
    assert_eq!(
        events_of(&shardq, setter).await,
        vec![("k".to_string(), json!({"n": 2, "attempt": 1}))],
        "the retry's replay set nothing"
    );

    // A workflow that never runs, with an event written by hand.
    let source = enqueue(&shardq, IDLE, "never_runs").await;
    execute(
        &shardq,
        source,
        "INSERT INTO workflow_events (shard_key, workflow_id, key, value) VALUES ($1, $2, 'k', '\"first\"')",
        &[&source.shard_key, &source.id],
    )
    .await;
    let shard = shard_of(&shardq, source).clone();
    let mut handlers = HandlerRegistry::new();
    handlers.register("reader", move |ctx| {
        let shard = shard.clone();
        async move {
            let from: JobId = ctx.payload["from"].as_str().unwrap().parse().unwrap();
            let got = ctx.get_event(from, "k", Duration::from_secs(5)).await?;
            let none = ctx
                .get_event(from, "late", Duration::from_millis(100))
                .await?;
            if ctx.attempt == 1 {
                // Both change before the retry.
                shard
                    .client()
                    .await?
                    .batch_execute(&format!(
                        "UPDATE workflow_events SET value = '\"changed\"' \
                         WHERE shard_key = {} AND workflow_id = {}; \
                         INSERT INTO workflow_events (shard_key, workflow_id, key, value) \
                         VALUES ({0}, {1}, 'late', '\"too late\"')",
                        from.shard_key, from.id
                    ))
                    .await?;
                return Err("failed after reading".into());
            }
            Ok(json!([got, none]))
        }
    });
    let reader = client
        .enqueue(NewJob::new(
            QUEUE,
            "reader",
            json!({ "from": source.to_string() }),
        ))
        .await
        .unwrap();
    let (stop, worker) = start_worker(&shardq, handlers);
    let outcome = client.result(reader, Duration::from_secs(30)).await;
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(
        outcome.unwrap(),
        JobOutcome::Succeeded(json!(["first", null])),
        "the retry returned what the first attempt got"
    );
    assert_eq!(
        client.get_event(source, "k", Duration::ZERO).await.unwrap(),
        Some(json!("changed"))
    );
}

/// A workflow waiting in `ctx.get_event` (in process, a minute's timeout)
/// is cancelled: the wait ends at once, nothing is recorded, and the job
/// ends cancelled (the worker learns of the cancel with its lease
/// extensions, every second here), well before the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_ends_a_get_event_wait() {
    let (_shards, shardq) = shardq_with(1, "lease_ms = 3000\n").await;
    let client = shardq.client();
    let source = enqueue(&shardq, IDLE, "never_runs").await;
    let mut handlers = HandlerRegistry::new();
    handlers.register("reader", |ctx| async move {
        let from: JobId = ctx.payload["from"].as_str().unwrap().parse().unwrap();
        let got = ctx
            .get_event(from, "never", Duration::from_secs(60))
            .await?;
        Ok(json!(got))
    });
    let reader = client
        .enqueue(NewJob::new(
            QUEUE,
            "reader",
            json!({ "from": source.to_string() }),
        ))
        .await
        .unwrap();
    let (stop, worker) = start_worker(&shardq, handlers);
    common::wait_until(Duration::from_secs(30), "the reader runs", || async {
        status(&shardq, reader).await == JobStatus::Running
    })
    .await;
    let asked = Instant::now();
    client.cancel(reader).await.unwrap();
    let outcome = client.result(reader, Duration::from_secs(30)).await;
    let took = asked.elapsed();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome.unwrap(), JobOutcome::Cancelled);
    assert!(
        took < Duration::from_secs(20),
        "not at the timeout: {took:?}"
    );
    assert!(
        steps_of(&shardq, reader).await.is_empty(),
        "nothing recorded"
    );
}

/// A running workflow, claimed (by hand) by owner `racer` with fence 7.
async fn running_workflow(shardq: &Shardq) -> JobId {
    let id = enqueue(shardq, IDLE, "never_runs").await;
    execute(
        shardq,
        id,
        "UPDATE workflow_status SET status = 'running', owner = 'racer', fence = 7, \
            attempts = 1, started_at = now(), lease_expires_at = now() + interval '1 hour' \
         WHERE shard_key = $1 AND id = $2",
        &[&id.shard_key, &id.id],
    )
    .await;
    id
}

fn set_event<'a>(id: JobId, name: &'a str, value: &'a Value, fence: i64) -> SetEvent<'a> {
    SetEvent {
        id,
        name,
        key: "k",
        value,
        owner: "racer",
        fence,
    }
}

/// The steps recorded for workflow `id`.
async fn steps_of(shardq: &Shardq, id: JobId) -> Vec<String> {
    shard_of(shardq, id)
        .client()
        .await
        .unwrap()
        .query(
            "SELECT step_name FROM workflow_steps WHERE shard_key = $1 AND workflow_id = $2 \
             ORDER BY step_name",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// An attempt whose lease was lost sets nothing: a set_event that reads
/// the fence while a recovery re-claims the workflow (driven statement by
/// statement: the re-claim holds the row, the set_event waits for it) sees
/// the new fence once it commits and writes neither the event nor its
/// step; one with a stale fence, or of a workflow being cancelled, the
/// same; the holder's writes both, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_out_or_cancelled_attempt_sets_nothing() {
    let (_shards, shardq) = shardq(1).await;
    let id = running_workflow(&shardq).await;
    let shard = shardq.shards().get(0).clone();
    let value = json!("stale");

    let mut db = shard.client().await.unwrap();
    let tx = db.transaction().await.unwrap();
    tx.execute(
        "UPDATE workflow_status SET owner = 'thief', fence = 8 WHERE shard_key = $1 AND id = $2",
        &[&id.shard_key, &id.id],
    )
    .await
    .unwrap();
    let racing = shard.clone();
    let set = tokio::spawn(async move {
        let value = json!("stale");
        events::set(&racing, set_event(id, "shardq:set_event:1", &value, 7)).await
    });
    common::until_lock_wait(shardq.shards().get(0), "a session waits for a lock").await;
    assert!(!set.is_finished(), "the set_event waits for the re-claim");
    tx.commit().await.unwrap();
    assert_eq!(set.await.unwrap().unwrap(), EventSet::NotHeld);
    assert!(events_of(&shardq, id).await.is_empty(), "no event");
    assert!(steps_of(&shardq, id).await.is_empty(), "no step");

    // Stale fence, given back to racer/7 after: nothing; then the holder.
    execute(
        &shardq,
        id,
        "UPDATE workflow_status SET owner = 'racer', fence = 7 WHERE shard_key = $1 AND id = $2",
        &[&id.shard_key, &id.id],
    )
    .await;
    let stale = events::set(&shard, set_event(id, "shardq:set_event:1", &value, 6))
        .await
        .unwrap();
    assert_eq!(stale, EventSet::NotHeld);
    assert!(events_of(&shardq, id).await.is_empty());
    let fresh = json!("held");
    for _ in 0..2 {
        let set = events::set(&shard, set_event(id, "shardq:set_event:1", &fresh, 7))
            .await
            .unwrap();
        assert_eq!(set, EventSet::Set);
    }
    assert_eq!(
        events_of(&shardq, id).await,
        vec![("k".to_string(), json!("held"))]
    );
    assert_eq!(steps_of(&shardq, id).await, vec!["shardq:set_event:1"]);

    // Cancellation asked: nothing.
    execute(
        &shardq,
        id,
        "UPDATE workflow_status SET cancel_requested = true WHERE shard_key = $1 AND id = $2",
        &[&id.shard_key, &id.id],
    )
    .await;
    let other = json!("after cancel");
    let cancelled = events::set(&shard, set_event(id, "shardq:set_event:2", &other, 7))
        .await
        .unwrap();
    assert_eq!(cancelled, EventSet::Cancelled);
    assert_eq!(
        events_of(&shardq, id).await,
        vec![("k".to_string(), json!("held"))]
    );
}

/// A get of a workflow no shard has is an error naming it (not a silent
/// `None`), from the client and from SQL; an invalid key is refused
/// before any read, saying what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_workflow_or_invalid_key_is_an_error() {
    let (_shards, shardq) = shardq(1).await;
    let client = shardq.client();
    let missing = JobId {
        shard_key: 5,
        id: 987_654,
    };
    let err = client
        .get_event(missing, "k", Duration::from_secs(5))
        .await
        .expect_err("no such workflow");
    assert!(
        matches!(err, ClientError::NotFound(id) if id == missing),
        "{err:?}"
    );
    assert!(err.to_string().contains("5-987654"), "{err}");

    let db = shardq.shards().get(0).client().await.unwrap();
    let err = db
        .query_one("SELECT shardq_get_event(5, 987654, 'k')", &[])
        .await
        .expect_err("no such workflow");
    assert_eq!(err.code().map(|c| c.code()), Some("SQ006"), "{err:?}");

    let known = enqueue(&shardq, IDLE, "never_runs").await;
    for (key, says) in [
        ("", "event key name is empty"),
        ("a\0b", "event key contains a NUL"),
        (&"x".repeat(300)[..], "event key is 300 bytes"),
    ] {
        let err = client
            .get_event(known, key, Duration::ZERO)
            .await
            .expect_err("an invalid key");
        assert!(
            matches!(err, ClientError::InvalidEvent { workflow, .. } if workflow == known),
            "{err:?}"
        );
        assert!(err.to_string().contains(says), "{err}");
    }
    let unset: Option<Value> = db
        .query_one(
            "SELECT shardq_get_event($1, $2, 'k')",
            &[&known.shard_key, &known.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(unset, None, "not set: NULL");
}

/// `SELECT * FROM shardq_send(...)` as a caller in another language would
/// run it: a workflow parked in a recv is woken by it and receives the
/// message well before its deadline (a minute away; promotion runs once a
/// minute); the same idempotency key again writes nothing; under
/// REPEATABLE READ and with an invalid topic it is refused, nothing
/// written; and `shardq_get_event` reads a set event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shardq_send_from_sql_wakes_a_waiting_recv_and_dedups() {
    let (_shards, shardq) = shardq(1).await;
    let client = shardq.client();
    let mut handlers = HandlerRegistry::new();
    handlers.register("await_go", |ctx| async move {
        let got = ctx.recv("go", Duration::from_secs(60)).await?;
        ctx.set_event("got", json!(got)).await?;
        Ok(json!(got))
    });
    let id = enqueue(&shardq, QUEUE, "await_go").await;
    let (stop, worker) = start_worker(&shardq, handlers);
    common::wait_until(Duration::from_secs(30), "the workflow parks", || async {
        status(&shardq, id).await == JobStatus::Scheduled
    })
    .await;
    let mut db = shardq.shards().get(0).client().await.unwrap();
    let send = "SELECT written, woken FROM shardq_send($1, $2, 'go', $3::jsonb, $4)";
    let message = json!({"n": 1});
    let key = "order-7";
    let sent = Instant::now();
    let row = db
        .query_one(send, &[&id.shard_key, &id.id, &message, &key])
        .await
        .unwrap();
    assert!(row.get::<_, bool>("written") && row.get::<_, bool>("woken"));
    let outcome = client.result(id, Duration::from_secs(30)).await.unwrap();
    let took = sent.elapsed();
    assert_eq!(outcome, JobOutcome::Succeeded(json!({"n": 1})));
    assert!(
        took < Duration::from_secs(20),
        "woken by the send: {took:?}"
    );
    stop.cancel();
    worker.await.unwrap();

    let got: Option<Value> = db
        .query_one(
            "SELECT shardq_get_event($1, $2, 'got')",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(got, Some(json!({"n": 1})), "shardq_get_event reads it");

    // A send again with the key, to a workflow still open: nothing written.
    let open = enqueue(&shardq, IDLE, "never_runs").await;
    for written in [true, false] {
        let row = db
            .query_one(send, &[&open.shard_key, &open.id, &message, &key])
            .await
            .unwrap();
        assert_eq!(row.get::<_, bool>("written"), written);
    }
    let tx = db
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await
        .unwrap();
    let err = tx
        .query_one(send, &[&open.shard_key, &open.id, &message, &"other"])
        .await
        .expect_err("refused under REPEATABLE READ");
    assert_eq!(
        err.code(),
        Some(&SqlState::INVALID_TRANSACTION_STATE),
        "{err:?}"
    );
    tx.rollback().await.unwrap();
    db.query_one(send, &[&open.shard_key, &open.id, &message, &None::<&str>])
        .await
        .expect("a send without a key");
    let err = db
        .query_one(
            "SELECT * FROM shardq_send($1, $2, '', '1')",
            &[&open.shard_key, &open.id],
        )
        .await
        .expect_err("an empty topic");
    assert_eq!(
        err.code(),
        Some(&SqlState::INVALID_PARAMETER_VALUE),
        "{err:?}"
    );
    let stored: i64 = db
        .query_one(
            "SELECT count(*) FROM workflow_messages WHERE shard_key = $1 AND workflow_id = $2",
            &[&open.shard_key, &open.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        stored, 2,
        "one for the key, one without: nothing refused was written"
    );
}

/// `shardq_send` to a finished workflow is refused (SQ007, its status in
/// DETAIL), to an id this shard does not have SQ006, and to a shard key of
/// another shard SQ001; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shardq_send_to_a_finished_missing_or_elsewhere_workflow_is_refused() {
    let (_shards, shardq) = shardq(2).await;
    let client = shardq.client();
    let mut handlers = HandlerRegistry::new();
    handlers.register("quick", |_ctx| async { Ok(Value::Null) });
    let done = enqueue(&shardq, QUEUE, "quick").await;
    let (stop, worker) = start_worker(&shardq, handlers);
    client.result(done, Duration::from_secs(30)).await.unwrap();
    stop.cancel();
    worker.await.unwrap();
    let db = shard_of(&shardq, done).client().await.unwrap();
    let send = "SELECT * FROM shardq_send($1, $2, 't', '1')";
    let err = db
        .query_one(send, &[&done.shard_key, &done.id])
        .await
        .expect_err("a finished workflow");
    let db_err = err.as_db_error().expect("a server error");
    assert_eq!(db_err.code().code(), "SQ007", "{err:?}");
    assert_eq!(db_err.detail(), Some("status=succeeded"));
    assert!(
        db_err.message().contains("succeeded"),
        "{}",
        db_err.message()
    );

    let here = shard_of(&shardq, done).index;
    let mine = done.shard_key;
    let err = db
        .query_one(send, &[&mine, &987_654_i64])
        .await
        .expect_err("no such workflow");
    assert_eq!(err.code().map(|c| c.code()), Some("SQ006"), "{err:?}");
    let elsewhere = (0..65_536)
        .find(|&k| shardq.shards().for_key(k).index != here)
        .unwrap();
    let err = db
        .query_one(send, &[&elsewhere, &987_654_i64])
        .await
        .expect_err("a key of another shard");
    assert_eq!(err.code().map(|c| c.code()), Some("SQ001"), "{err:?}");
    let stored: i64 = db
        .query_one("SELECT count(*) FROM workflow_messages", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 0, "nothing stored");
}
