//! The relay of children's wakes to parents on other shards is gated: one
//! process at a time holds the lease of a (children's shard, parents'
//! shard) pair and delivers its wakes (migration 39,
//! `children_elsewhere::relay_lease`); the others leave them. A holder that
//! stops renewing it (dead or stalled) loses it when it expires, and
//! another process delivers.

use crate::common;

use super::children_across::{children_on, key_on, two_shards};
use common::{wait_until, TestShards};
use serde_json::json;
use shardq::store::children_elsewhere::{give_up_relay_lease, relay_lease, RelayLease};
use shardq::{ChildResult, HandlerRegistry, JobOutcome, NewJob};
use std::sync::Arc;
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

/// A parent that starts a child keyed `away` and returns its output, and
/// the child, which finishes once the returned bell rings (rung after the
/// parent parked: else the parent could read it finished and never need
/// the wake).
fn parent_and_child(away: String) -> (HandlerRegistry, Arc<tokio::sync::Notify>) {
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
    let parked = Arc::new(tokio::sync::Notify::new());
    let go = parked.clone();
    handlers.register("child", move |_ctx| {
        let go = go.clone();
        async move {
            go.notified().await;
            Ok(json!("done"))
        }
    });
    (handlers, parked)
}

/// Waits until `parent`, on shard 0, is parked (neither running nor
/// queued).
async fn wait_parked(shardq: &shardq::Shardq, parent: shardq::JobId) {
    let db = shardq.shards().get(0).client().await.unwrap();
    wait_until(Duration::from_secs(30), "the parent parked", || async {
        db.query_one(
            "SELECT status <> 'running' AND status <> 'queued' FROM workflow_status \
             WHERE shard_key = $1 AND id = $2",
            &[&parent.shard_key, &parent.id],
        )
        .await
        .unwrap()
        .get::<_, bool>(0)
    })
    .await;
}

/// Two processes, driven step by step: the first takes the lease, the
/// second is refused while it lasts; the holder's calls write nothing
/// until less than half is left, then renew it; once the holder stops
/// renewing, the lease expires and the other takes it; a holder whose
/// delivery failed gives it up, and the other takes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_lease_has_one_holder_and_passes_on_when_it_is_not_renewed() {
    let shards = TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let db = set.get(0).client().await.unwrap();
    let ttl = Duration::from_secs(4);
    let on = &set;
    let lease = |holder: &'static str| async move {
        relay_lease(on, 0, 1, holder, ttl).await.unwrap() == RelayLease::Held
    };

    assert!(lease("a").await, "the first taker holds it");
    assert!(!lease("b").await, "held by a");
    match relay_lease(&set, 0, 1, "b", ttl).await.unwrap() {
        RelayLease::Elsewhere(left) => assert!(
            left > Duration::from_secs(3) && left <= ttl,
            "b leaves a's wakes alone for what is left of its lease: {left:?}"
        ),
        RelayLease::Held => panic!("held by a"),
    }
    let first = lease_version(&db, 1).await;
    assert!(lease("a").await);
    assert_eq!(
        lease_version(&db, 1).await,
        first,
        "more than half left: nothing written"
    );

    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert!(lease("a").await, "renewed with less than half left");
    assert_ne!(lease_version(&db, 1).await, first);
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert!(!lease("b").await, "the renewal still lasts");

    // a stops renewing.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(lease("b").await, "expired: b takes it");
    assert!(!lease("a").await, "and a has lost it");

    // b's delivery fails: it gives the lease up, and a takes it at once.
    give_up_relay_lease(&set, 0, 1, "b").await.unwrap();
    assert!(lease("a").await, "given up: a takes it");
    give_up_relay_lease(&set, 0, 1, "b").await.unwrap();
    assert!(!lease("b").await, "b gave up only its own lease");
}

/// The holder renews a lease that is due while another process finds it
/// expired a moment later and takes it: never both. Driven by setting the
/// lease's end: due for the holder, then past for the taker, whose write
/// commits first; the holder's renewal then meets the taker's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_and_a_taker_never_both_hold_the_lease() {
    let shards = TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let db = set.get(0).client().await.unwrap();
    let ttl = Duration::from_secs(60);
    assert!(relay_lease(&set, 0, 1, "a", ttl).await.unwrap() == RelayLease::Held);
    // Past: b takes it (as it would a moment after a's end).
    db.batch_execute("UPDATE shardq_relay_leases SET until = now() - interval '1 second'")
        .await
        .unwrap();
    assert!(relay_lease(&set, 0, 1, "b", ttl).await.unwrap() == RelayLease::Held);
    // a's renewal, which read its own row as due: the upsert finds b's.
    assert_ne!(
        relay_lease(&set, 0, 1, "a", ttl).await.unwrap(),
        RelayLease::Held
    );
}

/// Two takers race for an expired lease, twenty times over: each time
/// exactly one holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_takers_of_an_expired_lease_never_both_hold_it() {
    let shards = TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let db = set.get(0).client().await.unwrap();
    let ttl = Duration::from_secs(60);
    for round in 0..20 {
        let (a, b) = tokio::join!(
            relay_lease(&set, 0, 1, "a", ttl),
            relay_lease(&set, 0, 1, "b", ttl)
        );
        let held = [
            a.unwrap() == RelayLease::Held,
            b.unwrap() == RelayLease::Held,
        ];
        assert_eq!(
            held.iter().filter(|h| **h).count(),
            1,
            "round {round}: {held:?}"
        );
        db.batch_execute("UPDATE shardq_relay_leases SET until = now() - interval '1 second'")
            .await
            .unwrap();
    }
}

/// A parent on shard 0 awaits a child on shard 1 while another process
/// (gone quiet) holds the lease of relaying shard 1's wakes to shard 0,
/// for 6 s: the worker leaves the child's wake to it, and the parent stays
/// parked. Once the lease runs out unrenewed, the worker takes it and
/// delivers: the parent gets the child's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_waits_for_the_lease_holder_and_is_delivered_once_its_lease_expires() {
    let (_shards, shardq) = two_shards(QUEUE, 2, 50).await;
    let child_shard = shardq.shards().get(1).client().await.unwrap();

    let (handlers, parked) = parent_and_child(key_on(&shardq, 1));
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    let parent = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, "parent", json!({})).ordering_key(key_on(&shardq, 0)))
        .await
        .unwrap();

    wait_parked(&shardq, parent).await;
    // Another process took the lease of relaying shard 1's wakes to shard
    // 0 a moment ago, and then went quiet: it never renews it.
    child_shard
        .execute(
            "INSERT INTO shardq_relay_leases (to_index, holder, until) \
             VALUES (0, 'a-stalled-worker', now() + interval '6 seconds')",
            &[],
        )
        .await
        .unwrap();
    parked.notify_one();
    wait_until(Duration::from_secs(30), "the child succeeded", || async {
        let children = children_on(&shardq, 1, parent).await;
        children.len() == 1 && children[0].1 == "succeeded"
    })
    .await;
    // Past many relay passes (50 ms apart): the wake stays owed, the
    // parent parked, while the lease lasts.
    tokio::time::sleep(Duration::from_secs(1)).await;
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

    // Its lease runs out: the worker takes it and delivers.
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

/// A worker role not granted the lease table (an upgrade whose
/// `docs/least_privilege.sql` was not run again after `migrate`): the
/// relay delivers without the lease, as every process did before leases,
/// and the parent gets its child's result, instead of every pass failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_not_granted_the_lease_table_relays_without_it() {
    let shards = TestShards::databases(2).await;
    let extra = format!("[worker]\nqueues = [\"{QUEUE}\"]\nmaintenance_interval_ms = 50\n");
    let owner = shardq::Shardq::connect(shards.config(&extra)).unwrap();
    owner.migrate().await.unwrap();
    for (n, url) in shards.urls.iter().enumerate() {
        let (db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        db.batch_execute(include_str!("../../docs/least_privilege.sql"))
            .await
            .unwrap();
        db.batch_execute("REVOKE ALL ON TABLE shardq_relay_leases FROM shardq_worker")
            .await
            .unwrap();
        if n == 0 {
            db.batch_execute("CREATE ROLE relay_worker LOGIN IN ROLE shardq_worker")
                .await
                .unwrap();
        }
    }
    let toml = shards.toml(&extra).replace("postgres@", "relay_worker@");
    let worker_side = shardq::Shardq::connect(shardq::Config::from_toml(&toml).unwrap()).unwrap();

    let (handlers, parked) = parent_and_child(key_on(&owner, 1));
    let stop = CancellationToken::new();
    let worker = tokio::spawn(worker_side.worker(handlers).run(stop.clone()));
    let parent = owner
        .client()
        .enqueue(NewJob::new(QUEUE, "parent", json!({})).ordering_key(key_on(&owner, 0)))
        .await
        .unwrap();
    wait_parked(&owner, parent).await;
    parked.notify_one();
    let outcome = owner
        .client()
        .result(parent, Duration::from_secs(30))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(json!("done")));
}
