//! A parent whose child lives on a shard that does not answer when the
//! parent reads its child: the parent parks and looks again within seconds,
//! spending no attempt (with one attempt it would otherwise end dead), and
//! once the shard is back it gets the child's result. The same for a parent
//! that starts a child keyed to a shard that is down: it parks, and starts
//! the child (once) when the shard is back. Parents reading children on a
//! frozen shard, which this worker's claims found silent, park at once
//! instead of holding their slots until the statement deadline.

use crate::common;

use super::children_across::{key_on, nth_key_on};
use common::{wait_until, TestShards};
use serde_json::json;
use shardq::shards::Shard;
use shardq::{ChildResult, HandlerRegistry, JobId, JobOutcome, NewJob, Shardq};
use shardq_local::StopMode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "family";
/// A queue no worker serves: the child stays queued until the test ends it.
const IDLE: &str = "idle";

/// Waits until workflow `id` (`who`), on `shard`, is parked and due
/// within seconds, not in an hour; fails at once if it ended dead (an
/// outage spent its only attempt).
pub(crate) async fn parked_due_soon(shard: &Shard, id: JobId, who: &str) {
    let db = shard.client().await.unwrap();
    wait_until(
        Duration::from_secs(30),
        &format!("{who} parked"),
        || async {
            let row = db
                .query_one(
                    "SELECT status, parked, run_at < now() + interval '10 seconds' \
                 FROM workflow_status WHERE shard_key = $1 AND id = $2",
                    &[&id.shard_key, &id.id],
                )
                .await
                .unwrap();
            let status: String = row.get(0);
            assert_ne!(status, "dead", "the outage spent {who}'s only attempt");
            status == "scheduled" && row.get::<_, bool>(1) && row.get::<_, bool>(2)
        },
    )
    .await;
}

/// `servers` fresh shards, migrated, configured for a worker of `queue`
/// with two slots, passes of upkeep every 100 ms and the deadlines given: short ones
/// to see an outage at once, long ones under which a call waiting on a
/// frozen server would hold its slot for minutes.
pub(crate) async fn two_slots(
    queue: &str,
    servers: usize,
    connect_ms: u64,
    statement_ms: u64,
) -> (TestShards, Shardq) {
    let shards = TestShards::servers(servers).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{queue}\"]\nconcurrency = 2\nmaintenance_interval_ms = 100\n\
         [database]\nconnect_timeout_ms = {connect_ms}\nstatement_timeout_ms = {statement_ms}\n"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    (shards, shardq)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_parks_while_its_childs_shard_is_down_and_spends_no_attempt() {
    let (shards, shardq) = two_slots(QUEUE, 2, 1000, 3000).await;
    let (home, away) = (key_on(&shardq, 0), key_on(&shardq, 1));
    let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let runs = Arc::new(AtomicU32::new(0));
    let mut handlers = HandlerRegistry::new();
    let (told, wait, counted) = (started.clone(), go.clone(), runs.clone());
    handlers.register("parent", move |ctx| {
        let (told, wait, counted, away) =
            (told.clone(), wait.clone(), counted.clone(), away.clone());
        async move {
            let child = ctx
                .start_child(NewJob::new(IDLE, "child", json!({})).ordering_key(away))
                .await?;
            if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                told.notify_one();
                wait.notified().await;
            }
            match child.result().await? {
                ChildResult::Succeeded(v) => Ok(v),
                other => Err(format!("the child ended {other:?}").into()),
            }
        }
    });
    let parent = shardq
        .client()
        .enqueue(
            NewJob::new(QUEUE, "parent", json!({}))
                .ordering_key(home)
                .max_attempts(1),
        )
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    started.notified().await;
    shards.servers[1].stop(StopMode::Immediate).unwrap();
    go.notify_one();

    // Parked (no attempt spent), due within seconds, not in an hour.
    parked_due_soon(shardq.shards().get(0), parent, "the parent").await;

    shards.servers[1].start_again().unwrap();
    let child_db = tokio_postgres::connect(&shards.urls[1], tokio_postgres::NoTls);
    let (child_db, connection) = child_db.await.unwrap();
    tokio::spawn(connection);
    child_db
        .execute(
            "UPDATE workflow_status SET status = 'succeeded', output = '42', finished_at = now() \
             WHERE handler = 'child'",
            &[],
        )
        .await
        .unwrap();
    let outcome = shardq
        .client()
        .result(parent, Duration::from_secs(60))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(json!(42)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_parks_while_the_shard_of_a_child_it_starts_is_down() {
    let (shards, shardq) = two_slots(QUEUE, 2, 1000, 3000).await;
    let (home, away) = (key_on(&shardq, 0), key_on(&shardq, 1));
    let child_runs = Arc::new(AtomicU32::new(0));
    let mut handlers = HandlerRegistry::new();
    handlers.register("parent", move |ctx| {
        let away = away.clone();
        async move {
            let child = NewJob::new(QUEUE, "child", json!({})).ordering_key(away);
            match ctx.start_child(child).await?.result().await? {
                ChildResult::Succeeded(v) => Ok(v),
                other => Err(format!("the child ended {other:?}").into()),
            }
        }
    });
    let counted = child_runs.clone();
    handlers.register("child", move |_ctx| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(json!(7))
        }
    });
    shards.servers[1].stop(StopMode::Immediate).unwrap();
    let parent = shardq
        .client()
        .enqueue(
            NewJob::new(QUEUE, "parent", json!({}))
                .ordering_key(home)
                .max_attempts(1),
        )
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));

    parked_due_soon(shardq.shards().get(0), parent, "the parent").await;

    shards.servers[1].start_again().unwrap();
    let outcome = shardq
        .client()
        .result(parent, Duration::from_secs(60))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(json!(7)));
    assert_eq!(child_runs.load(Ordering::SeqCst), 1, "one child, run once");
    let rows = shardq.shards().get(1).client().await.unwrap();
    let rows = rows
        .query_one(
            "SELECT count(*) FROM workflow_status WHERE handler = 'child'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        rows.get::<_, i64>(0),
        1,
        "one child row, whatever the parks"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parents_reading_children_on_a_frozen_shard_park_and_leave_the_slots_to_others() {
    use nix::sys::signal::Signal;
    let (shards, shardq) = two_slots(QUEUE, 3, 120000, 120000).await;
    let runs = Arc::new(AtomicU32::new(0));
    let mut handlers = HandlerRegistry::new();
    let counted = runs.clone();
    handlers.register("parent", move |ctx| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            let key = ctx.payload["child_key"].as_str().unwrap().to_string();
            let child = NewJob::new(IDLE, "child", json!({})).ordering_key(key);
            match ctx.start_child(child).await?.result().await? {
                ChildResult::Succeeded(v) => Ok(v),
                other => Err(format!("the child ended {other:?}").into()),
            }
        }
    });
    handlers.register("other", |_ctx| async move { Ok(json!("ran")) });
    let client = shardq.client();
    let mut parents = Vec::new();
    for n in 0..2 {
        let payload = json!({ "child_key": nth_key_on(&shardq, 1, n) });
        let job = NewJob::new(QUEUE, "parent", payload).ordering_key(nth_key_on(&shardq, 0, n));
        parents.push(client.enqueue(job).await.unwrap());
    }
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    for &parent in &parents {
        parked_due_later(shardq.shards().get(0), parent).await;
    }
    let frozen = shards.servers[1].server();
    frozen.signal_all(Signal::SIGSTOP).expect("SIGSTOP");
    // The worker's claims there go unanswered within their budget.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Both parents run again now and read their children.
    let home = shardq.shards().get(0).client().await.unwrap();
    home.execute(
        "UPDATE workflow_status SET run_at = now() WHERE handler = 'parent'",
        &[],
    )
    .await
    .unwrap();
    let both_again = async {
        while runs.load(Ordering::SeqCst) < 4 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), both_again)
        .await
        .expect("both parents run again");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = NewJob::new(QUEUE, "other", json!({})).ordering_key(key_on(&shardq, 2));
    let other = client.enqueue(other).await.unwrap();
    let healthy = client.result(other, Duration::from_secs(20)).await;
    frozen.signal_all(Signal::SIGCONT).expect("SIGCONT");
    assert_eq!(
        healthy.unwrap(),
        JobOutcome::Succeeded(json!("ran")),
        "a job of a healthy shard gets a slot while the parents park"
    );
    let children = shardq.shards().get(1).client().await.unwrap();
    children
        .execute(
            "UPDATE workflow_status SET status = 'succeeded', output = '\"done\"', \
             finished_at = now() WHERE handler = 'child'",
            &[],
        )
        .await
        .unwrap();
    for parent in parents {
        let outcome = client
            .result(parent, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(outcome, JobOutcome::Succeeded(json!("done")));
    }
    stop.cancel();
    worker.await.unwrap();
}

/// Waits until workflow `id`, on `shard`, is parked on its child (due in
/// the far recheck, not soon).
async fn parked_due_later(shard: &Shard, id: JobId) {
    let db = shard.client().await.unwrap();
    wait_until(Duration::from_secs(30), "the parent parked", || async {
        let row = db
            .query_one(
                "SELECT status = 'scheduled' AND parked FROM workflow_status \
                 WHERE shard_key = $1 AND id = $2",
                &[&id.shard_key, &id.id],
            )
            .await
            .unwrap();
        row.get::<_, bool>(0)
    })
    .await;
}
