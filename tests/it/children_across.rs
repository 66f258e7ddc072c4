//! Child workflows on another shard than their parent's (a child keyed to
//! a key that lives there): started once whatever crashes between the
//! writes on the two shards, a result that reaches its parent whether the
//! child finishes before the parent asks or after it parked (its shard's
//! promotion relays the wake), and a cancel that cascades across shards.

use crate::common;

use common::TestShards;
use serde_json::{json, Value};
use shardq::store::children::StartChild;
use shardq::store::children_elsewhere::{
    self as elsewhere, ChildRow, Identity, Intent, ParentStep,
};
use shardq::store::steps::{self, RecordStep};
use shardq::{ChildResult, HandlerRegistry, JobId, JobOutcome, JobStatus, NewJob, Shardq};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "family";
/// A queue no worker of these tests serves: its jobs stay unfinished.
const IDLE: &str = "idle";

/// Two migrated shards; the worker runs one job at a time and promotes
/// (and relays wakes) every 50 ms.
async fn shardq() -> (TestShards, Shardq) {
    two_shards(QUEUE, 1, 50).await
}

/// Two migrated shards, for a worker of `queue` running `concurrency`
/// jobs at once, promoting (and relaying wakes) every `upkeep_ms`.
pub(crate) async fn two_shards(
    queue: &str,
    concurrency: usize,
    upkeep_ms: u64,
) -> (TestShards, Shardq) {
    let shards = TestShards::databases(2).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{queue}\"]\nconcurrency = {concurrency}\n\
         maintenance_interval_ms = {upkeep_ms}\n"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    (shards, shardq)
}

/// An ordering key that lives on shard `index`.
pub(crate) fn key_on(shardq: &Shardq, index: usize) -> String {
    nth_key_on(shardq, index, 0)
}

/// The `n`th ordering key (from 0) that lives on shard `index`.
pub(crate) fn nth_key_on(shardq: &Shardq, index: usize, n: usize) -> String {
    let routed = |k: &String| {
        shardq
            .shards()
            .for_key(shardq::router::shard_key_for(k))
            .index
    };
    (0..10_000)
        .map(|n| format!("key-{n}"))
        .filter(|k| routed(k) == index)
        .nth(n)
        .expect("a key on the shard")
}

/// The rows on shard `index` whose parent is `parent`: (id, status).
pub(crate) async fn children_on(
    shardq: &Shardq,
    index: usize,
    parent: JobId,
) -> Vec<(JobId, String)> {
    shardq
        .shards()
        .get(index)
        .client()
        .await
        .unwrap()
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

/// A parent on shard 0 starts a child keyed to shard 1 and awaits it; the
/// child waits until the parent has asked (so the parent parks), then
/// succeeds. The child's shard relays the wake: the parent runs again and
/// returns the child's output. One child, on shard 1, linked to its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_on_another_shard_runs_once_and_wakes_its_parked_parent() {
    let (_shards, shardq) = shardq().await;
    a_child_wakes_its_parent_across_shards(&shardq, Duration::ZERO).await;
}

/// The same, with the relay's timer a minute: the child's completion,
/// which leaves its parent's wake to the relay, rings it (its shard's
/// listener hears it), and the relay delivers the wake at once, well
/// within the 30 s the parent's result is waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_finish_rings_the_relay_without_waiting_for_its_timer() {
    let (_shards, shardq) = two_shards(QUEUE, 1, 60_000).await;
    a_child_wakes_its_parent_across_shards(&shardq, Duration::from_secs(3)).await;
}

async fn a_child_wakes_its_parent_across_shards(shardq: &Shardq, settle: Duration) {
    let (home, away) = (key_on(shardq, 0), key_on(shardq, 1));
    let parent_runs = Arc::new(AtomicU32::new(0));
    let child_runs = Arc::new(AtomicU32::new(0));
    let asked = Arc::new(tokio::sync::Notify::new());
    let mut handlers = HandlerRegistry::new();
    let (runs, told) = (parent_runs.clone(), asked.clone());
    handlers.register("parent", move |ctx| {
        let (runs, told, away) = (runs.clone(), told.clone(), away.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let job = NewJob::new(QUEUE, "child", json!({"n": 7})).ordering_key(away);
            let child = ctx.start_child(job).await?;
            let result = child.result().await;
            told.notify_one();
            match result? {
                ChildResult::Succeeded(out) => {
                    Ok(json!({"child": child.id().to_string(), "out": out}))
                }
                other => Err(format!("child ended {other:?}").into()),
            }
        }
    });
    let (runs, told) = (child_runs.clone(), asked.clone());
    handlers.register("child", move |ctx| {
        let (runs, told) = (runs.clone(), told.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            told.notified().await;
            Ok(json!(ctx.payload["n"].as_i64().unwrap() * 6))
        }
    });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    // The relay's first passes run before the listeners are up (a second
    // apart at most); after them, its timer is the maintenance interval.
    tokio::time::sleep(settle).await;
    let parent = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, "parent", json!({})).ordering_key(home))
        .await
        .unwrap();
    let outcome = shardq
        .client()
        .result(parent, Duration::from_secs(30))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    let children = children_on(shardq, 1, parent).await;
    assert_eq!(children.len(), 1, "one child, on shard 1: {children:?}");
    assert_eq!(children[0].1, "succeeded");
    assert!(children_on(shardq, 0, parent).await.is_empty());
    assert_eq!(
        outcome,
        JobOutcome::Succeeded(json!({"child": children[0].0.to_string(), "out": 42}))
    );
    assert_eq!(child_runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        parent_runs.load(Ordering::SeqCst),
        2,
        "parked once, woken once"
    );
}

/// Child step 1 of `parent` (claimed by hand), on the idle queue, keyed
/// by `key`.
pub(crate) fn first_child_of<'a>(
    parent: JobId,
    key: &'a str,
    payload: &'a Value,
) -> StartChild<'a> {
    StartChild {
        parent,
        name: "shardq:child:1",
        owner: "racer",
        fence: 7,
        queue: IDLE,
        handler: "child",
        payload,
        ordering_key: Some(key),
        group: None,
        priority: 0,
        delay: Duration::ZERO,
        max_attempts: 3,
        abandon_on_parent_cancel: false,
        timeout_ms: None,
    }
}

/// Child `id`'s identity as [`first_child_of`]'s start records it.
pub(crate) fn named(id: JobId) -> Identity<'static> {
    Identity {
        id,
        queue: IDLE,
        handler: "child",
    }
}

/// Child step 1 of `parent` (claimed by hand on shard 0): an id reserved
/// for key `key` on the shard that holds it (`on`), recorded as the
/// parent's identity of the child.
pub(crate) async fn identity_recorded(
    shardq: &Shardq,
    parent: JobId,
    on: usize,
    key: &str,
) -> JobId {
    let shard_key = shardq::router::shard_key_for(key);
    let id = JobId {
        shard_key,
        id: elsewhere::reserve_id(shardq.shards().get(on), shard_key)
            .await
            .unwrap(),
    };
    let step = ParentStep {
        parent,
        name: "shardq:child:1",
        owner: "racer",
        fence: 7,
    };
    assert_eq!(
        elsewhere::intent(shardq.shards().get(0), step, named(id))
            .await
            .unwrap(),
        Intent::Reserved(id, None)
    );
    id
}

/// A parent claimed by hand (owner `racer`, fence 7) on shard 0.
pub(crate) async fn running_parent(shardq: &Shardq) -> JobId {
    let home = key_on(shardq, 0);
    let id = shardq
        .client()
        .enqueue(NewJob::new(IDLE, "never_runs", json!({})).ordering_key(home))
        .await
        .unwrap();
    shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET status = 'running', owner = 'racer', fence = 7, \
                attempts = 1, started_at = now(), lease_expires_at = now() + interval '1 hour' \
             WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap();
    id
}

/// The writes of a start on two shards, driven one by one: the identity
/// reserved on shard 1 and recorded on shard 0, the child inserted, then
/// a crash before the start is recorded. The next run reserves another id,
/// but the identity recorded first is kept, its insert writes nothing, and
/// the start is recorded with it; a run after that finds the start. One
/// child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_childs_insert_and_its_start_leaves_one_child() {
    let (_shards, shardq) = shardq().await;
    let parent = running_parent(&shardq).await;
    let away_key = key_on(&shardq, 1);
    let away = shardq::router::shard_key_for(&away_key);
    let (home, there) = (shardq.shards().get(0), shardq.shards().get(1));
    let payload = json!({});
    let start = first_child_of(parent, &away_key, &payload);
    let step = ParentStep {
        parent,
        name: "shardq:child:1",
        owner: "racer",
        fence: 7,
    };
    let insert = |id| ChildRow {
        id,
        parent,
        parent_deadline: None,
        job: &start,
    };

    let first = identity_recorded(&shardq, parent, 1, &away_key).await;
    elsewhere::insert(there, insert(first)).await.unwrap();
    // The crash: the start is not recorded. The next run:
    let second = JobId {
        shard_key: away,
        id: elsewhere::reserve_id(there, away).await.unwrap(),
    };
    assert_ne!(second, first);
    let recorded = elsewhere::intent(home, step, named(second)).await.unwrap();
    assert_eq!(
        recorded,
        Intent::Reserved(first, None),
        "the first identity is kept"
    );
    elsewhere::insert(there, insert(first)).await.unwrap();
    let started = json!({"child_shard_key": away, "child_id": first.id});
    let record = RecordStep {
        id: parent,
        name: "shardq:child:1",
        output: &started,
        owner: "racer",
        fence: 7,
    };
    assert!(steps::record(home, record).await.unwrap());
    assert_eq!(
        elsewhere::intent(home, step, named(second)).await.unwrap(),
        Intent::Started(first),
        "a later run finds the start"
    );
    assert_eq!(
        children_on(&shardq, 1, parent).await,
        vec![(first, "queued".to_string())],
        "one child, on shard 1"
    );
}

/// A parent parked on its child on another shard (the child's queue is
/// not served: it stays queued) is cancelled: the child, on shard 1, ends
/// cancelled with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parent_cancels_its_child_on_another_shard() {
    let (_shards, shardq) = shardq().await;
    let away = key_on(&shardq, 1);
    let mut handlers = HandlerRegistry::new();
    handlers.register("parent", move |ctx| {
        let away = away.clone();
        async move {
            let job = NewJob::new(IDLE, "never_runs", json!({})).ordering_key(away);
            ctx.start_child(job).await?.result().await?;
            Ok(Value::Null)
        }
    });
    let parent = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, "parent", json!({})).ordering_key(key_on(&shardq, 0)))
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    let parked = async {
        loop {
            let info = shardq
                .client()
                .job(parent)
                .await
                .unwrap()
                .expect("the parent");
            if info.status == JobStatus::Scheduled {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), parked)
        .await
        .expect("the parent parks on its child");
    let children = children_on(&shardq, 1, parent).await;
    assert_eq!(children.len(), 1, "{children:?}");
    assert_eq!(children[0].1, "queued");
    assert_eq!(
        shardq.client().cancel(parent).await.unwrap(),
        Some(JobStatus::Cancelled)
    );
    assert_eq!(
        children_on(&shardq, 1, parent).await,
        vec![(children[0].0, "cancelled".to_string())],
        "the cancel cascaded to shard 1"
    );
    stop.cancel();
    worker.await.unwrap();
}

/// Parents on shards 1 and 2 park on children that live on shard 0; shard
/// 1's server is frozen (SIGSTOP) before the children finish, with
/// statement deadlines of two minutes. The wake owed to shard 2's parent
/// is delivered while shard 1 stays frozen (the relay delivers each
/// parents' shard in a task of its own); shard 1's parent gets its wake
/// once its server is back. Each child ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_parents_shard_holds_back_only_its_own_wakes() {
    use nix::sys::signal::Signal;
    let shards = TestShards::servers(3).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nconcurrency = 4\nmaintenance_interval_ms = 50\n\
         [database]\nstatement_timeout_ms = 120000\n"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let child_runs = Arc::new(AtomicU32::new(0));
    let mut handlers = HandlerRegistry::new();
    handlers.register("parent", |ctx| async move {
        // Each child its own key on shard 0 (a key runs one job at a time).
        let key = ctx.payload["child_key"].as_str().unwrap().to_string();
        let job = NewJob::new(QUEUE, "child", json!({})).ordering_key(key);
        match ctx.start_child(job).await?.result().await? {
            ChildResult::Succeeded(out) => Ok(out),
            other => Err(format!("child ended {other:?}").into()),
        }
    });
    let (released, runs) = (release.clone(), child_runs.clone());
    handlers.register("child", move |_ctx| {
        let (released, runs) = (released.clone(), runs.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            released.acquire().await.unwrap().forget();
            Ok(json!("done"))
        }
    });
    let mut parents = Vec::new();
    for index in [1, 2] {
        let payload = json!({ "child_key": nth_key_on(&shardq, 0, index) });
        let job = NewJob::new(QUEUE, "parent", payload).ordering_key(key_on(&shardq, index));
        parents.push(shardq.client().enqueue(job).await.unwrap());
    }
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    let parked = async {
        loop {
            let mut all = true;
            for &p in &parents {
                let info = shardq.client().job(p).await.unwrap().expect("parent");
                all &= info.status == JobStatus::Scheduled;
            }
            if all && child_runs.load(Ordering::SeqCst) == 2 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), parked)
        .await
        .expect("both parents park, both children run");
    let frozen = &shards.servers[1];
    frozen
        .server()
        .signal_all(Signal::SIGSTOP)
        .expect("SIGSTOP");
    release.add_permits(2);
    let healthy = shardq
        .client()
        .result(parents[1], Duration::from_secs(30))
        .await;
    frozen
        .server()
        .signal_all(Signal::SIGCONT)
        .expect("SIGCONT");
    assert_eq!(
        healthy.unwrap(),
        JobOutcome::Succeeded(json!("done")),
        "shard 2's parent is woken while shard 1 is frozen"
    );
    let late = shardq
        .client()
        .result(parents[0], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(late, JobOutcome::Succeeded(json!("done")));
    assert_eq!(child_runs.load(Ordering::SeqCst), 2, "each child ran once");
    stop.cancel();
    worker.await.unwrap();
}

/// The value of the series `name{labels}` in an exposition, if present.
fn gauge(text: &str, name: &str, labels: &str) -> Option<f64> {
    let series = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map(|v| v.parse().expect("a number"))
}

/// A child on shard 0 that finished 5 s ago owes its parent on shard 1 a
/// wake: the exporter shows it pending from s0 to s1, with its age, until
/// the relay delivers it; then the series is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exporter_shows_the_wakes_owed_across_shards_until_they_are_delivered() {
    let (_shards, shardq) = shardq().await;
    let parent = shardq
        .client()
        .enqueue(NewJob::new(IDLE, "never_runs", json!({})).ordering_key(key_on(&shardq, 1)))
        .await
        .unwrap();
    let child = shardq
        .client()
        .enqueue(NewJob::new(IDLE, "never_runs", json!({})).ordering_key(key_on(&shardq, 0)))
        .await
        .unwrap();
    // The child's final status, written as a completion would (its
    // trigger flags the wake), 5 s ago.
    shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET parent_shard_key = $3, parent_id = $4, \
                status = 'succeeded', finished_at = now() - interval '5 s' \
             WHERE shard_key = $1 AND id = $2",
            &[&child.shard_key, &child.id, &parent.shard_key, &parent.id],
        )
        .await
        .unwrap();
    let config = shardq.config().clone();
    let check = shardq::client::CheckOptions {
        deadline: Duration::from_secs(5),
        ..shardq::client::CheckOptions::from_config(&config)
    };
    let client = shardq.client();
    let scrape = || shardq::prometheus::backlog::scrape_with_check(&client, &[], &check);
    let labels = "from=\"s0\",to=\"s1\"";
    let text = scrape().await;
    assert_eq!(
        gauge(&text, "shardq_cross_shard_wakes_pending", labels),
        Some(1.0),
        "{text}"
    );
    let age = gauge(&text, "shardq_cross_shard_wake_oldest_seconds", labels).unwrap();
    assert!((4.0..60.0).contains(&age), "{age}");

    let owed = elsewhere::wakes_owed(shardq.shards(), 0, &[])
        .await
        .unwrap();
    let pairs: Vec<_> = owed[&1].iter().map(|w| (w.parent, w.child)).collect();
    assert_eq!(pairs, vec![(parent, child)]);
    let delivered = elsewhere::deliver(shardq.shards(), 0, 1, &owed[&1])
        .await
        .unwrap();
    assert_eq!(
        delivered, 1,
        "the parent's shard took it (its parent waits on nothing)"
    );
    let text = scrape().await;
    assert_eq!(
        gauge(&text, "shardq_cross_shard_wakes_pending", labels),
        None,
        "{text}"
    );
}

/// A child whose row is not where the map routes it (a move leaves a
/// finished child on its old shard; a process's map can be older than a
/// move): its parent's result() asks every shard before it calls the child
/// missing, finds it, and records its outcome. Three shards: the child is
/// started on shard 1, finishes, and its row is moved to shard 2 by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_finds_a_child_that_is_not_where_the_map_routes_it() {
    let shards = TestShards::databases(3).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nconcurrency = 1\nmaintenance_interval_ms = 50\n"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    let moved = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let away = key_on(&shardq, 1);
    let mut handlers = HandlerRegistry::new();
    let (moved_here, started_here) = (moved.clone(), started.clone());
    handlers.register("parent", move |ctx| {
        let (moved, started, away) = (moved_here.clone(), started_here.clone(), away.clone());
        async move {
            let job = NewJob::new(IDLE, "never_runs", json!({})).ordering_key(away);
            let child = ctx.start_child(job).await?;
            started.notify_one();
            moved.notified().await;
            match child.result().await? {
                ChildResult::Succeeded(out) => Ok(out),
                other => Err(format!("child ended {other:?}").into()),
            }
        }
    });
    let parent = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, "parent", json!({})).ordering_key(key_on(&shardq, 0)))
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    tokio::time::timeout(Duration::from_secs(30), started.notified())
        .await
        .expect("the parent starts its child");
    let children = children_on(&shardq, 1, parent).await;
    assert_eq!(children.len(), 1);
    let child = children[0].0;
    // The child succeeds, then its row goes to shard 2.
    let (from, to) = (
        shardq.shards().get(1).client().await.unwrap(),
        shardq.shards().get(2).client().await.unwrap(),
    );
    let row: String = from
        .query_one(
            "UPDATE workflow_status SET status = 'succeeded', finished_at = now(), \
                output = '\"found\"' WHERE shard_key = $1 AND id = $2 \
             RETURNING row_to_json(workflow_status)::text",
            &[&child.shard_key, &child.id],
        )
        .await
        .unwrap()
        .get(0);
    to.execute(
        "INSERT INTO workflow_status OVERRIDING SYSTEM VALUE \
         SELECT * FROM json_populate_record(NULL::workflow_status, $1::text::json)",
        &[&row],
    )
    .await
    .unwrap();
    from.execute(
        "DELETE FROM workflow_status WHERE shard_key = $1 AND id = $2",
        &[&child.shard_key, &child.id],
    )
    .await
    .unwrap();
    moved.notify_one();
    let outcome = shardq
        .client()
        .result(parent, Duration::from_secs(30))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(json!("found")));
}
