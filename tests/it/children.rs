//! Child workflows (`JobContext::start_child`, `ChildHandle::result`): one
//! child per call site whatever replays or crashes; a result of a child
//! that finished first returns at once; an unfinished one parks the parent
//! (no slot: a parent under concurrency 1 gathers ten children) until the
//! child's final status wakes it, never a retried attempt; the park and
//! the completion are ordered by the parent's row lock, in every order;
//! a cancel cascades to the unfinished children and grandchildren.
//! Children on another shard: `children_across.rs`.

use crate::common;

use common::TestShards;
use serde_json::{json, Value};
use shardq::store::children::{self, AwaitChild, Awaited, StartChild, Started};
use shardq::store::sql;
use shardq::tokio_postgres::types::Type;
use shardq::{
    ChildResult, HandlerRegistry, JobId, JobOutcome, JobStatus, NewJob, Shardq, StepError,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "family";
/// A queue no worker of these tests serves: its jobs stay unfinished.
const IDLE: &str = "idle";
/// The owner and fence of the claims these tests make by hand.
const OWNER: &str = "racer";
const FENCE: i64 = 7;

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

/// Runs a worker with `handlers` until job `id` has finished; its outcome.
async fn run_until_finished(shardq: &Shardq, handlers: HandlerRegistry, id: JobId) -> JobOutcome {
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    let outcome = shardq
        .client()
        .result(id, Duration::from_secs(60))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    outcome
}

async fn db(shardq: &Shardq) -> shardq::shards::PooledClient {
    shardq.shards().get(0).client().await.unwrap()
}

/// The children of `parent` on the shard: (id, status), by id.
async fn children_of(shardq: &Shardq, parent: JobId) -> Vec<(JobId, String)> {
    db(shardq)
        .await
        .query(
            "SELECT shard_key, id, status FROM workflow_status \
             WHERE parent_shard_key = $1 AND parent_id = $2 ORDER BY id",
            &[&parent.shard_key, &parent.id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let id = JobId {
                shard_key: r.get(0),
                id: r.get(1),
            };
            (id, r.get(2))
        })
        .collect()
}

/// (status, run_at <= now(), run_at > now() + 30 min, parent_wake) of a job.
async fn row(shardq: &Shardq, id: JobId) -> (String, bool, bool, Option<bool>) {
    let r = db(shardq)
        .await
        .query_one(
            "SELECT status, run_at <= now(), run_at > now() + interval '30 minutes', \
                parent_wake FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

/// A parent that starts one child (payload `n`) and returns its result.
fn parent_of_one(handlers: &mut HandlerRegistry, runs: Arc<Mutex<u32>>) {
    handlers.register("parent", move |ctx| {
        let runs = runs.clone();
        async move {
            *runs.lock().unwrap() += 1;
            let child = ctx
                .start_child(NewJob::new(QUEUE, "child", json!({ "n": 4 })))
                .await?;
            match child.result().await? {
                ChildResult::Succeeded(v) => Ok(json!({ "child": v })),
                other => Ok(json!(format!("{other:?}"))),
            }
        }
    });
}

/// A child that multiplies its payload's `n` by 10.
fn times_ten(ctx: &shardq::JobContext) -> Value {
    json!(ctx.payload["n"].as_i64().unwrap_or(0) * 10)
}

/// A parent whose child is still running parks (its one worker slot then
/// runs the child), says what it waits for, and is woken by the child's
/// completion: two runs, the child's output returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_parent_is_woken_by_its_childs_completion() {
    let (_shards, shardq) = shardq().await;
    let runs = Arc::new(Mutex::new(0));
    let release = Arc::new(Notify::new());
    let mut handlers = HandlerRegistry::new();
    parent_of_one(&mut handlers, runs.clone());
    let gate = release.clone();
    handlers.register("child", move |ctx| {
        let gate = gate.clone();
        async move {
            gate.notified().await;
            Ok(times_ten(&ctx))
        }
    });
    let client = shardq.client();
    let parent = client
        .enqueue(NewJob::new(QUEUE, "parent", json!({})))
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    // The parent's park is written by the completer, in a batch after its
    // slot was given back: the child may be running a moment before it.
    common::wait_until(
        Duration::from_secs(30),
        "the child runs and the parent is parked",
        || async {
            let running = children_of(&shardq, parent)
                .await
                .first()
                .is_some_and(|(_, s)| s == "running");
            let parked = client
                .job(parent)
                .await
                .unwrap()
                .expect("the parent")
                .status
                == JobStatus::Scheduled;
            running && parked
        },
    )
    .await;
    let child = children_of(&shardq, parent).await[0].0;
    let info = client.job(parent).await.unwrap().expect("the parent");
    assert_eq!(info.status, JobStatus::Scheduled, "parked, no slot held");
    assert_eq!(
        info.waiting_for,
        Some(format!("child workflow {child}")),
        "job show says what it waits for"
    );
    release.notify_one();
    let outcome = client
        .result(parent, Duration::from_secs(30))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(json!({ "child": 40 })));
    assert_eq!(*runs.lock().unwrap(), 2, "parked once, woken once");
    assert_eq!(children_of(&shardq, parent).await.len(), 1, "one child");
}

/// A child that finished before its parent asks (here: before the parent
/// runs again after an unrelated sleep) is not lost: `result` returns at
/// once, and the parent never parks on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_finished_before_the_parent_asks_returns_at_once() {
    let (_shards, shardq) = shardq().await;
    let waits = Arc::new(Mutex::new(0));
    let mut handlers = HandlerRegistry::new();
    let counted = waits.clone();
    handlers.register("parent", move |ctx| {
        let counted = counted.clone();
        async move {
            let child = ctx
                .start_child(NewJob::new(QUEUE, "child", json!({ "n": 1 })))
                .await?;
            // The child runs (and finishes) while the parent sleeps.
            ctx.sleep(Duration::from_millis(500)).await?;
            match child.result().await {
                Err(StepError::WaitingForChild(..)) => {
                    *counted.lock().unwrap() += 1;
                    Err("parked on a finished child".into())
                }
                Ok(ChildResult::Succeeded(v)) => Ok(v),
                other => Ok(json!(format!("{other:?}"))),
            }
        }
    });
    handlers.register("child", |ctx| async move { Ok(times_ten(&ctx)) });
    let parent = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, "parent", json!({})))
        .await
        .unwrap();
    let outcome = run_until_finished(&shardq, handlers, parent).await;
    assert_eq!(outcome, JobOutcome::Succeeded(json!(10)));
    assert_eq!(*waits.lock().unwrap(), 0, "never parked on its child");
}

/// A parent that fails after `start_child` and is retried replays the
/// start: the same child, never a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_parent_starts_one_child() {
    let (_shards, shardq) = shardq().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut handlers = HandlerRegistry::new();
    let noted = seen.clone();
    handlers.register("parent", move |ctx| {
        let noted = noted.clone();
        async move {
            let child = ctx
                .start_child(NewJob::new(QUEUE, "child", json!({ "n": 2 })))
                .await?;
            noted.lock().unwrap().push(child.id());
            if ctx.attempt < 3 {
                return Err("fails after starting its child".into());
            }
            match child.result().await? {
                ChildResult::Succeeded(v) => Ok(v),
                other => Ok(json!(format!("{other:?}"))),
            }
        }
    });
    handlers.register("child", |ctx| async move { Ok(times_ten(&ctx)) });
    let parent = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, "parent", json!({})).max_attempts(5))
        .await
        .unwrap();
    let outcome = run_until_finished(&shardq, handlers, parent).await;
    assert_eq!(outcome, JobOutcome::Succeeded(json!(20)));
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 3, "{seen:?}");
    assert!(seen.iter().all(|c| *c == seen[0]), "one id: {seen:?}");
    let kids = children_of(&shardq, parent).await;
    assert_eq!(kids.len(), 1, "one child: {kids:?}");
    assert_eq!(kids[0].0, seen[0]);
}

/// The session of the start of child step 1 is killed after the child's
/// row was inserted and before the step's record (a test trigger stalls
/// that insert): the attempt fails, nothing of it stays, and the retried
/// parent starts exactly one child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_childs_insert_and_its_record_leaves_one_child() {
    let (_shards, shardq) = shardq().await;
    let db = db(&shardq).await;
    let stall = |body: &str| {
        format!(
            "CREATE OR REPLACE FUNCTION test_stall_child_record() RETURNS trigger \
             LANGUAGE plpgsql AS $$ BEGIN {body} RETURN NEW; END $$"
        )
    };
    db.batch_execute(&stall(
        "IF NEW.step_name ~ '^shardq:child:[0-9]+$' THEN PERFORM pg_sleep(60); END IF;",
    ))
    .await
    .unwrap();
    db.batch_execute(
        "CREATE TRIGGER test_stall_child_record BEFORE INSERT ON workflow_steps \
         FOR EACH ROW EXECUTE FUNCTION test_stall_child_record()",
    )
    .await
    .unwrap();
    let mut handlers = HandlerRegistry::new();
    parent_of_one(&mut handlers, Arc::new(Mutex::new(0)));
    handlers.register("child", |ctx| async move { Ok(times_ten(&ctx)) });
    let client = shardq.client();
    let parent = client
        .enqueue(NewJob::new(QUEUE, "parent", json!({})))
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    let stalled = "SELECT pid FROM pg_stat_activity \
        WHERE wait_event = 'PgSleep' AND datname = current_database() \
            AND query LIKE '%shardq_start_child%'";
    common::wait_until(
        Duration::from_secs(30),
        "the start stalls between its child's insert and its record",
        || async { !db.query(stalled, &[]).await.unwrap().is_empty() },
    )
    .await;
    // The child's row is written, not committed: the next start must not
    // find it, nor the killed one leave it.
    db.batch_execute(&stall("")).await.unwrap();
    let killed: i64 = db
        .query_one(
            &format!("SELECT count(pg_terminate_backend(pid)) FROM ({stalled}) s"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1);
    let outcome = client
        .result(parent, Duration::from_secs(60))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(json!({ "child": 40 })));
    let kids = children_of(&shardq, parent).await;
    assert_eq!(kids.len(), 1, "one child: {kids:?}");
    let attempts: i32 = db
        .query_one(
            "SELECT attempts FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&parent.shard_key, &parent.id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(attempts >= 2, "the killed attempt failed: {attempts}");
}

/// Under concurrency 1 (one slot for the whole worker), a parent starts
/// ten children and gathers their results: it holds no slot while it
/// waits, so the children run and their completions wake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_gathers_ten_children_under_concurrency_one() {
    let (_shards, shardq) = shardq().await;
    let mut handlers = HandlerRegistry::new();
    handlers.register("fan_out", |ctx| async move {
        let mut started = Vec::new();
        for n in 0..10 {
            let job = NewJob::new(QUEUE, "child", json!({ "n": n }));
            started.push(ctx.start_child(job).await?);
        }
        let mut sum = 0;
        for child in &started {
            match child.result().await? {
                ChildResult::Succeeded(v) => sum += v.as_i64().unwrap_or(0),
                other => return Ok(json!(format!("{other:?}"))),
            }
        }
        Ok(json!(sum))
    });
    handlers.register("child", |ctx| async move { Ok(times_ten(&ctx)) });
    let parent = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, "fan_out", json!({})))
        .await
        .unwrap();
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        run_until_finished(&shardq, handlers, parent),
    )
    .await
    .expect("the parent does not starve its children");
    assert_eq!(outcome, JobOutcome::Succeeded(json!(450)));
    assert_eq!(children_of(&shardq, parent).await.len(), 10);
}

/// A workflow claimed by hand (owner [`OWNER`], fence [`FENCE`]).
async fn running_workflow(shardq: &Shardq) -> JobId {
    let id = shardq
        .client()
        .enqueue(NewJob::new(IDLE, "never_runs", json!({})))
        .await
        .unwrap();
    claim_by_hand(shardq, id, OWNER, FENCE).await;
    id
}

async fn claim_by_hand(shardq: &Shardq, id: JobId, owner: &str, fence: i64) {
    db(shardq)
        .await
        .execute(
            "UPDATE workflow_status SET status = 'running', owner = $3, fence = $4, \
                attempts = attempts + 1, started_at = now(), \
                lease_expires_at = now() + interval '1 hour' \
             WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id, &owner, &fence],
        )
        .await
        .unwrap();
}

/// Starts child step `n` of `parent` (claimed by hand) on the idle queue.
async fn start(shardq: &Shardq, parent: JobId, n: u32) -> JobId {
    start_child(shardq, parent, n, false).await
}

/// [`start`], the child abandoned by a cancel of its parent or not.
async fn start_child(shardq: &Shardq, parent: JobId, n: u32, abandon: bool) -> JobId {
    let name = format!("shardq:child:{n}");
    let payload = json!({});
    let started = children::start(
        shardq.shards().get(0),
        StartChild {
            parent,
            name: &name,
            owner: OWNER,
            fence: FENCE,
            queue: IDLE,
            handler: "never_runs",
            payload: &payload,
            ordering_key: None,
            group: None,
            priority: 0,
            delay: Duration::ZERO,
            max_attempts: 3,
            abandon_on_parent_cancel: abandon,
            timeout_ms: None,
        },
    )
    .await
    .unwrap();
    match started {
        Started::Child(child) => child,
        other => panic!("{other:?}"),
    }
}

fn await_child<'a>(parent: JobId, name: &'a str, child: JobId) -> AwaitChild<'a> {
    AwaitChild {
        parent,
        name,
        child,
        owner: OWNER,
        fence: FENCE,
        recheck: Duration::from_secs(3600),
    }
}

/// The result step's first statement in `tx`: the parent's row lock.
async fn park_lock(tx: &tokio_postgres::Transaction<'_>, parent: JobId) -> bool {
    tx.query_typed_one(
        sql::CHILD_RESULT_LOCK,
        &[
            (&parent.shard_key, Type::INT4),
            (&parent.id, Type::INT8),
            (&OWNER, Type::TEXT),
            (&FENCE, Type::INT8),
        ],
    )
    .await
    .unwrap()
    .get("owned")
}

/// The result step's second statement in `tx`: its output (NULL while it
/// waits).
async fn park_decide(
    tx: &tokio_postgres::Transaction<'_>,
    parent: JobId,
    name: &str,
    child: JobId,
) -> Option<Value> {
    let recheck_ms = 3_600_000_i64;
    tx.query_typed_one(
        sql::CHILD_RESULT_DECIDE,
        &[
            (&parent.shard_key, Type::INT4),
            (&parent.id, Type::INT8),
            (&name, Type::TEXT),
            (&child.shard_key, Type::INT4),
            (&child.id, Type::INT8),
            (&recheck_ms, Type::INT8),
        ],
    )
    .await
    .unwrap()
    .get("output")
}

/// The worker's completion of `child` (claimed by `kid`, `fence`) as
/// `status`, in `tx`, as the completer writes it (output `{"v": 1}`, and
/// the error `boom` unless it succeeded).
async fn complete(tx: &tokio_postgres::Transaction<'_>, child: JobId, fence: i64, status: &str) {
    let error = (status != "succeeded").then_some("boom");
    tx.execute(
        "SELECT * FROM shardq_complete_many(ARRAY[$1::int], ARRAY[$2::bigint], \
            ARRAY[$3::bigint], ARRAY[$4::text], ARRAY['{\"v\": 1}'::jsonb], 'kid', \
            ARRAY[$5::text], 10, 20)",
        &[&child.shard_key, &child.id, &fence, &status, &error],
    )
    .await
    .unwrap();
}

/// A parent's park and its child's completion, driven statement by
/// statement in each order. (1) The park holds the parent's lock when the
/// child completes: the completion does not wait (it only tries that
/// lock) and flags the child; the park's decision, a later statement,
/// sees the child finished. (2) The park decided to wait when the child
/// completes: the flag makes the promotion wake the parent. (3) The park
/// committed first: the completion wakes the parent itself. (4) The
/// completion holds the parent's lock (its try succeeded): the park waits
/// for it, then sees the child finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_and_a_childs_completion_never_lose_the_wake() {
    let (_shards, shardq) = shardq().await;
    let shard = shardq.shards().get(0).clone();
    let parent = running_workflow(&shardq).await;
    let mut park = db(&shardq).await;
    let mut completer = db(&shardq).await;
    let finished = |v: Option<Value>| v.expect("decided")["status"].clone();

    // (1) Child 1 completes between the park's lock and its decision.
    let child = start(&shardq, parent, 1).await;
    claim_by_hand(&shardq, child, "kid", 1).await;
    let tx = park.transaction().await.unwrap();
    assert!(park_lock(&tx, parent).await);
    let done = completer.transaction().await.unwrap();
    complete(&done, child, 1, "succeeded").await;
    done.commit().await.unwrap();
    assert_eq!(
        row(&shardq, child).await.3,
        Some(true),
        "the wake is flagged"
    );
    let decided = park_decide(&tx, parent, "shardq:child:1:result", child).await;
    tx.commit().await.unwrap();
    assert_eq!(finished(decided), json!("succeeded"), "the park sees it");
    children::wake_pending(&shard, 100).await.unwrap();
    assert_eq!(row(&shardq, child).await.3, None, "the flag is settled");

    // (2) Child 2 completes after the park decided to wait, before it
    // commits: flagged, and the promotion's pass wakes the parent.
    let child = start(&shardq, parent, 2).await;
    claim_by_hand(&shardq, child, "kid", 1).await;
    let tx = park.transaction().await.unwrap();
    assert!(park_lock(&tx, parent).await);
    assert_eq!(
        park_decide(&tx, parent, "shardq:child:2:result", child).await,
        None
    );
    let done = completer.transaction().await.unwrap();
    complete(&done, child, 1, "succeeded").await;
    done.commit().await.unwrap();
    tx.commit().await.unwrap();
    let (_, due, far, flag) = row(&shardq, parent).await;
    assert!(!due && far && flag.is_none(), "parked an hour ahead");
    assert_eq!(row(&shardq, child).await.3, Some(true));
    assert_eq!(children::wake_pending(&shard, 100).await.unwrap(), 1);
    assert!(
        row(&shardq, parent).await.1,
        "woken by the promotion's pass"
    );
    assert_eq!(
        children::result(&shard, await_child(parent, "shardq:child:2:result", child))
            .await
            .unwrap(),
        Awaited::Finished(json!({ "status": "succeeded", "output": { "v": 1 }, "error": null }))
    );

    // (3) The park commits its wait first: the completion wakes the parent.
    let child = start(&shardq, parent, 3).await;
    claim_by_hand(&shardq, child, "kid", 1).await;
    let waiting = children::result(&shard, await_child(parent, "shardq:child:3:result", child))
        .await
        .unwrap();
    assert!(matches!(waiting, Awaited::Waiting(_)), "{waiting:?}");
    assert!(row(&shardq, parent).await.2, "parked an hour ahead");
    let done = completer.transaction().await.unwrap();
    complete(&done, child, 1, "succeeded").await;
    done.commit().await.unwrap();
    assert!(row(&shardq, parent).await.1, "the completion woke it");
    assert_eq!(row(&shardq, child).await.3, None, "no flag: woken at once");

    // (4) The completion (its try of the parent's lock succeeded) holds
    // the parent's row: the park waits, then sees the child finished.
    let child = start(&shardq, parent, 4).await;
    claim_by_hand(&shardq, child, "kid", 1).await;
    let done = completer.transaction().await.unwrap();
    complete(&done, child, 1, "dead").await;
    let racing = shard.clone();
    let parked = tokio::spawn(async move {
        children::result(&racing, await_child(parent, "shardq:child:4:result", child)).await
    });
    common::until_lock_wait(
        shardq.shards().get(0),
        "the park waits for the completion's lock",
    )
    .await;
    assert!(!parked.is_finished());
    done.commit().await.unwrap();
    assert_eq!(
        parked.await.unwrap().unwrap(),
        Awaited::Finished(json!({ "status": "dead", "output": { "v": 1 }, "error": "boom" }))
    );
}

/// A child's failed attempt that will be retried leaves its parked parent
/// parked; only its final status wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_retried_failure_does_not_wake_the_parent() {
    let (_shards, shardq) = shardq().await;
    let shard = shardq.shards().get(0).clone();
    let parent = running_workflow(&shardq).await;
    let child = start(&shardq, parent, 1).await;
    let waiting = children::result(&shard, await_child(parent, "shardq:child:1:result", child))
        .await
        .unwrap();
    assert!(matches!(waiting, Awaited::Waiting(_)));
    let mut completer = db(&shardq).await;
    claim_by_hand(&shardq, child, "kid", 1).await;
    let done = completer.transaction().await.unwrap();
    complete(&done, child, 1, "failed").await;
    done.commit().await.unwrap();
    assert_eq!(row(&shardq, child).await.0, "scheduled", "to be retried");
    let (_, due, far, _) = row(&shardq, parent).await;
    assert!(!due && far, "still parked: a retried failure wakes nobody");
    children::wake_pending(&shard, 100).await.unwrap();
    assert!(row(&shardq, parent).await.2, "nothing pending either");
    claim_by_hand(&shardq, child, "kid", 2).await;
    let done = completer.transaction().await.unwrap();
    complete(&done, child, 2, "succeeded").await;
    done.commit().await.unwrap();
    assert!(row(&shardq, parent).await.1, "its success wakes the parent");
}

/// A cancel of a parent cancels its unfinished children and theirs: the
/// waiting ones end cancelled, a running one gets the request; a finished
/// child is left as it is, and so is one started with
/// `ChildPolicy::Abandon`, with its own child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_cascades_to_children_and_grandchildren() {
    let (_shards, shardq) = shardq().await;
    let shard = shardq.shards().get(0).clone();
    let parent = running_workflow(&shardq).await;
    let queued = start(&shardq, parent, 1).await;
    let running = start(&shardq, parent, 2).await;
    let finished = start(&shardq, parent, 3).await;
    claim_by_hand(&shardq, finished, "kid", 1).await;
    let mut completer = db(&shardq).await;
    let done = completer.transaction().await.unwrap();
    complete(&done, finished, 1, "succeeded").await;
    done.commit().await.unwrap();
    // The running child starts a grandchild of its own.
    claim_by_hand(&shardq, running, OWNER, FENCE).await;
    let grandchild = start(&shardq, running, 1).await;
    // An abandoned child (ChildPolicy::Abandon) and its own child run on.
    let abandoned = start_child(&shardq, parent, 4, true).await;
    claim_by_hand(&shardq, abandoned, OWNER, FENCE).await;
    let its_child = start(&shardq, abandoned, 1).await;

    let cancelled = shardq.client().cancel(parent).await.unwrap();
    assert_eq!(cancelled, Some(JobStatus::Running), "the parent is asked");
    let state = |id: JobId| {
        let shard = shard.clone();
        async move {
            let r = shard
                .client()
                .await
                .unwrap()
                .query_one(
                    "SELECT status, cancel_requested FROM workflow_status \
                     WHERE shard_key = $1 AND id = $2",
                    &[&id.shard_key, &id.id],
                )
                .await
                .unwrap();
            (r.get::<_, String>(0), r.get::<_, bool>(1))
        }
    };
    assert_eq!(state(queued).await, ("cancelled".into(), false));
    assert_eq!(state(running).await, ("running".into(), true));
    assert_eq!(state(grandchild).await, ("cancelled".into(), false));
    assert_eq!(state(finished).await, ("succeeded".into(), false));
    assert_eq!(state(abandoned).await, ("running".into(), false));
    assert_eq!(state(its_child).await, ("queued".into(), false));
    // The cancelled parent starts nothing more.
    let name = "shardq:child:5";
    let payload = json!({});
    let refused = children::start(
        &shard,
        StartChild {
            parent,
            name,
            owner: OWNER,
            fence: FENCE,
            queue: IDLE,
            handler: "never_runs",
            payload: &payload,
            ordering_key: None,
            group: None,
            priority: 0,
            delay: Duration::ZERO,
            max_attempts: 3,
            abandon_on_parent_cancel: false,
            timeout_ms: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(refused, Started::Cancelled);
}

/// A cancel racing a running child's completion: the completion holds the
/// child's row, the cancel waits, and finds it finished; the child ends
/// in one final status, and its parent's result is that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_racing_a_childs_completion_ends_it_once() {
    let (_shards, shardq) = shardq().await;
    let shard = shardq.shards().get(0).clone();
    let parent = running_workflow(&shardq).await;
    let child = start(&shardq, parent, 1).await;
    claim_by_hand(&shardq, child, "kid", 1).await;
    let mut completer = db(&shardq).await;
    let done = completer.transaction().await.unwrap();
    complete(&done, child, 1, "succeeded").await;
    let client = shardq.client();
    let cancel = tokio::spawn(async move { client.cancel(child).await });
    common::until_lock_wait(
        shardq.shards().get(0),
        "the cancel waits for the completion",
    )
    .await;
    done.commit().await.unwrap();
    assert_eq!(cancel.await.unwrap().unwrap(), None, "already finished");
    assert_eq!(row(&shardq, child).await.0, "succeeded");
    let result = children::result(&shard, await_child(parent, "shardq:child:1:result", child))
        .await
        .unwrap();
    assert_eq!(
        result,
        Awaited::Finished(json!({ "status": "succeeded", "output": { "v": 1 }, "error": null }))
    );
}

/// One worker's completion batch holding both a child's final outcome and
/// its parent's park (the parent waited on the child, which then finished
/// at once), in either order: the batch is written, and wakes the parent.
/// (A wake from inside the batch's update, where the trigger ran, failed
/// the whole statement when it woke a row the same statement wrote later,
/// on every retry: the worker held both jobs forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_a_childs_completion_and_its_parents_park_wakes_the_parent() {
    let (_shards, shardq) = shardq().await;
    for child_first in [true, false] {
        let parent = running_workflow(&shardq).await;
        let child = start(&shardq, parent, 1).await;
        claim_by_hand(&shardq, child, OWNER, FENCE).await;
        let mut conn = db(&shardq).await;
        let tx = conn.transaction().await.unwrap();
        assert!(park_lock(&tx, parent).await);
        assert_eq!(
            park_decide(&tx, parent, "shardq:child:1:result", child).await,
            None
        );
        tx.commit().await.unwrap();
        let (first, second, statuses) = match child_first {
            true => (child, parent, ["succeeded", "parked"]),
            false => (parent, child, ["parked", "succeeded"]),
        };
        let written: i64 = conn
            .query_one(
                "SELECT succeeded FROM shardq_complete_many(ARRAY[$1::int, $2::int], \
                    ARRAY[$3::bigint, $4::bigint], ARRAY[$5::bigint, $5::bigint], \
                    ARRAY[$6::text, $7::text], ARRAY['{}'::jsonb, NULL::jsonb], $8, \
                    ARRAY[NULL::text, NULL::text], 10, 20)",
                &[
                    &first.shard_key,
                    &second.shard_key,
                    &first.id,
                    &second.id,
                    &FENCE,
                    &statuses[0],
                    &statuses[1],
                    &OWNER,
                ],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(written, 1, "the child's success is written");
        let woken: (String, bool) = conn
            .query_one(
                "SELECT status, run_at <= now() FROM workflow_status \
                 WHERE shard_key = $1 AND id = $2",
                &[&parent.shard_key, &parent.id],
            )
            .await
            .map(|r| (r.get(0), r.get(1)))
            .unwrap();
        assert_eq!(
            woken,
            ("queued".to_string(), true),
            "child first: {child_first}"
        );
    }
}
