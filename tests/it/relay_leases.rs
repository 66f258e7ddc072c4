//! The relay of children's wakes to parents on other shards is gated: one
//! process at a time holds the lease of a (children's shard, parents'
//! shard) pair and delivers its wakes (migration 39,
//! `children_elsewhere::relay_lease`); the others leave them. A holder that
//! stops renewing it (dead or stalled) loses it when it expires, and
//! another process delivers.

use crate::common;

use super::children_across::{children_on, key_on};
use common::{wait_until, TestShards};
use serde_json::json;
use shardq::store::children_elsewhere::relay_lease;
use shardq::{ChildResult, HandlerRegistry, JobOutcome, NewJob, Shardq};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "family";

/// The lease row's version (`xmin`): unchanged when a call wrote nothing.
async fn lease_version(db: &tokio_postgres::Client, to: i32) -> String {
    db.query_one(
        "SELECT xmin::text FROM shardq_relay_leases WHERE to_index = $1",
        &[&to],
    )
    .await
    .unwrap()
    .get(0)
}

/// Two processes, driven step by step: the first takes the lease, the
/// second is refused while it lasts; the holder's calls write nothing
/// until less than half is left, then renew it; once the holder stops
/// renewing, the lease expires and the other takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_lease_has_one_holder_and_passes_on_when_it_is_not_renewed() {
    let shards = TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let db = set.get(0).client().await.unwrap();
    let ttl = Duration::from_millis(1_000);
    let lease = |holder: &'static str| relay_lease(&set, 0, 1, holder, ttl);

    assert!(lease("a").await.unwrap(), "the first taker holds it");
    assert!(!lease("b").await.unwrap(), "held by a");
    let first = lease_version(&db, 1).await;
    assert!(lease("a").await.unwrap());
    assert_eq!(
        lease_version(&db, 1).await,
        first,
        "more than half left: nothing written"
    );

    tokio::time::sleep(Duration::from_millis(650)).await;
    assert!(
        lease("a").await.unwrap(),
        "renewed with less than half left"
    );
    assert_ne!(lease_version(&db, 1).await, first);
    tokio::time::sleep(Duration::from_millis(650)).await;
    assert!(!lease("b").await.unwrap(), "the renewal still lasts");

    // a stops renewing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(lease("b").await.unwrap(), "expired: b takes it");
    assert!(!lease("a").await.unwrap(), "and a has lost it");
}

/// Two takers race for an expired lease, twenty times over: each time
/// exactly one holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_takers_of_an_expired_lease_never_both_hold_it() {
    let shards = TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let ttl = Duration::from_millis(100);
    for round in 0..20 {
        let (a, b) = tokio::join!(
            relay_lease(&set, 0, 1, "a", ttl),
            relay_lease(&set, 0, 1, "b", ttl)
        );
        let held = [a.unwrap(), b.unwrap()];
        assert_eq!(
            held.iter().filter(|h| **h).count(),
            1,
            "round {round}: {held:?}"
        );
        tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    }
}

/// A parent on shard 0 awaits a child on shard 1 while another process
/// (gone quiet) holds the lease of relaying shard 1's wakes to shard 0:
/// the worker leaves the child's wake to it, and the parent stays parked.
/// Once the lease expires unrenewed, the worker takes it and delivers:
/// the parent gets the child's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_waits_for_the_lease_holder_and_is_delivered_once_its_lease_expires() {
    let shards = TestShards::databases(2).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nconcurrency = 2\nmaintenance_interval_ms = 50\n"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    let child_shard = shardq.shards().get(1).client().await.unwrap();
    child_shard
        .execute(
            "INSERT INTO shardq_relay_leases (to_index, holder, until) \
             VALUES (0, 'a-stalled-worker', now() + interval '1 hour')",
            &[],
        )
        .await
        .unwrap();

    let away = key_on(&shardq, 1);
    let mut handlers = HandlerRegistry::new();
    handlers.register("parent", move |ctx| {
        let away = away.clone();
        async move {
            let job = NewJob::new(QUEUE, "child", json!({})).ordering_key(away);
            match ctx.start_child(job).await?.result().await? {
                ChildResult::Succeeded(out) => Ok(out),
                other => Err(format!("child ended {other:?}").into()),
            }
        }
    });
    handlers.register("child", |_ctx| async move { Ok(json!("done")) });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    let parent = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, "parent", json!({})).ordering_key(key_on(&shardq, 0)))
        .await
        .unwrap();

    wait_until(Duration::from_secs(30), "the child succeeded", || async {
        let children = children_on(&shardq, 1, parent).await;
        children.len() == 1 && children[0].1 == "succeeded"
    })
    .await;
    // Well past a few relay passes (50 ms apart, a second at most while
    // wakes are left): the wake stays owed, the parent parked.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let owed: i64 = child_shard
        .query_one(
            "SELECT count(*) FROM workflow_status WHERE parent_wake",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owed, 1, "the wake was left to the lease's holder");
    let status = shardq.client().job(parent).await.unwrap().unwrap().status;
    assert_ne!(status.to_string(), "succeeded", "woken without the lease");

    // The holder stops renewing: its lease runs out.
    child_shard
        .execute(
            "UPDATE shardq_relay_leases SET until = now() - interval '1 second'",
            &[],
        )
        .await
        .unwrap();
    let outcome = shardq
        .client()
        .result(parent, Duration::from_secs(30))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(json!("done")));
    let holder: String = child_shard
        .query_one(
            "SELECT holder FROM shardq_relay_leases WHERE to_index = 0",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_ne!(holder, "a-stalled-worker", "the worker took the lease over");
}
