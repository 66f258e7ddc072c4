//! Enqueues into a range while it moves: old snapshots refused, open
//! transactions not stalled, the least-privilege producer's rights.

use crate::common;

use super::{growing_to_three, moving_key, repeatable_read, WORKER_TOML};
use common::{wait_until, TestShards};
use serde_json::json;
use shardq::reshard::{reshard, Options, Step};
use shardq::{Client, JobStatus, NewJob};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// An enqueue in a REPEATABLE READ transaction whose snapshot was taken
/// before a range was released (another range still moves in, so the hold
/// trigger stays): its snapshot reads the range as moving, and without the
/// release mark the job was written held after the release and stayed held
/// for good. It is refused with 40001 (nothing written), and the
/// transaction run again writes it ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeatable_read_enqueue_older_than_the_release_is_refused_not_held() {
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    assert!(m.plan.moves.len() >= 2, "{:?}", m.plan.moves);
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &opened, |_| {}).await.unwrap();
    let client = Client::new(&m.new).unwrap();
    client.shards().load_map().await.unwrap();
    let first = &m.plan.moves[0];
    let key = (0..)
        .map(|i| format!("late-{i}"))
        .find(|k| {
            let at = shardq::router::shard_key_for(k);
            first.first_key <= at && at < first.end_key
        })
        .unwrap();
    let job = || {
        client
            .route(NewJob::new("moving", "noop", json!({})).ordering_key(key.clone()))
            .unwrap()
    };
    let target = m.all.get(first.to_index);
    let mut db = target.user_client().await.unwrap();
    let tx = repeatable_read(&mut db).await;
    tx.query_one("SELECT count(*) FROM shardq_map_moves", &[])
        .await
        .unwrap(); // the snapshot is taken here

    shardq::store::reshard::release(target, 2, (first.first_key, first.end_key))
        .await
        .unwrap();
    let refused = job()
        .insert(&*tx)
        .await
        .expect_err("a snapshot older than the release");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE),
        "{refused:?}"
    );
    tx.rollback().await.unwrap();

    let tx = repeatable_read(&mut db).await;
    let id = job().insert(&*tx).await.expect("run again");
    tx.commit().await.unwrap();
    let info = client.job(id).await.unwrap().expect("the job");
    assert_eq!(info.status, JobStatus::Queued, "released, not held");
}

/// A caller's transaction holding an enqueue open on an old shard (the
/// map's lock shared) while the move records its epoch: the record's
/// exclusive request must not queue that shard's other enqueues behind it
/// for a statement deadline (60 s here). It gives up at the sessions'
/// `lock_timeout` (`database.lock_timeout_ms`, 2 s by default) and is tried
/// again; the other enqueue goes through while the transaction is still
/// open, and the move finishes once it commits. (With `lock_timeout_ms =
/// 0` the enqueue waited behind the record: seen failing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_enqueue_transaction_does_not_stall_the_shard_behind_the_move() {
    let slow = format!("{WORKER_TOML}[database]\nstatement_timeout_ms = 60000\n");
    let m = growing_to_three(TestShards::databases(3).await, &slow).await;
    let client = Client::new(&m.new).unwrap();
    client.shards().load_map().await.unwrap();
    let on_shard_0 = |name: &str| {
        let key = (0..)
            .map(|i| format!("{name}-{i}"))
            .find(|k| shardq::router::shard_key_for(k) < 16_384)
            .unwrap();
        NewJob::new("moving", "noop", json!({})).ordering_key(key)
    };
    let routed = client.route(on_shard_0("open")).unwrap();
    let mut db = routed.shard().user_client().await.unwrap();
    let tx = db.transaction().await.unwrap();
    routed.insert(&*tx).await.unwrap();

    let retried = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let moving = tokio::spawn({
        let (all, retried) = (m.all.clone(), retried.clone());
        async move {
            reshard(&all, 2, 3, &Options::default(), |p| {
                if let shardq::reshard::Progress::Retrying { error } = p {
                    assert!(error.contains("lock timeout"), "{error}");
                    retried.fetch_add(1, Ordering::SeqCst);
                }
            })
            .await
        }
    });
    wait_until(
        Duration::from_secs(20),
        "the record gives up and retries",
        || async { retried.load(Ordering::SeqCst) > 0 },
    )
    .await;
    tokio::time::timeout(Duration::from_secs(10), client.enqueue(on_shard_0("other")))
        .await
        .expect("another enqueue on the shard is not stalled behind the move")
        .unwrap();
    assert!(
        !moving.is_finished(),
        "the move waits for the open transaction"
    );
    tx.commit().await.unwrap();
    let summary = moving.await.unwrap().unwrap();
    assert!(summary.complete);
}

/// The documented least-privilege producer (docs/least_privilege.sql)
/// enqueues into a range moving in: the hold trigger runs with its rights
/// and reads the map tables and the release mark, which every role may
/// read. (Without the mark's grant it was refused with 42501 for the whole
/// move.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_producer_enqueues_into_a_moving_range() {
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &opened, |_| {}).await.unwrap();
    let target = m.all.get(2);
    let admin = target.client().await.unwrap();
    admin
        .batch_execute(include_str!("../../../docs/least_privilege.sql"))
        .await
        .unwrap();
    admin
        .batch_execute("CREATE ROLE app_producer LOGIN IN ROLE shardq_producer")
        .await
        .unwrap();
    let url = m.servers.urls[2].replace("postgres@", "app_producer@");
    let (producer, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let client = Client::new(&m.new).unwrap();
    client.shards().load_map().await.unwrap();
    let job = client
        .route(NewJob::new("moving", "noop", json!({})).ordering_key(moving_key(&m.plan, "lp")))
        .unwrap();
    assert_eq!(job.shard().index, 2);
    let id = job.insert(&producer).await.expect("the producer enqueues");
    let info = client.job(id).await.unwrap().expect("the job");
    assert_eq!(info.status, JobStatus::Held);
}

/// An enqueue in a REPEATABLE READ transaction on the old shard whose
/// snapshot was taken before the new epoch was recorded there: by its
/// snapshot the key is still this shard's, and the job would be written on
/// a shard its range has left (after the release, nothing moves it, and it
/// runs beside its key's jobs on the new shard). It is refused with 40001.
/// (Written there before the map change mark: seen failing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeatable_read_enqueue_older_than_the_epoch_is_refused_on_the_old_shard() {
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let client = Client::new(&m.new).unwrap();
    client.shards().load_map().await.unwrap();
    let key = moving_key(&m.plan, "stale-snapshot");
    let routed = client
        .route(NewJob::new("moving", "noop", json!({})).ordering_key(key))
        .unwrap();
    let old = routed.shard().clone();
    assert!(old.index < 2, "routed by the map of two");
    let mut db = old.user_client().await.unwrap();
    let tx = repeatable_read(&mut db).await;
    tx.query_one("SELECT count(*) FROM shardq_map_epochs", &[])
        .await
        .unwrap(); // the snapshot is taken here
    let recorded = Options {
        stop_after: Some(Step::Recorded),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &recorded, |_| {}).await.unwrap();
    let refused = routed
        .insert(&*tx)
        .await
        .expect_err("a snapshot older than the epoch");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE),
        "{refused:?}"
    );
}
