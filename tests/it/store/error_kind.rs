//! `ShardError::kind`: what a failed statement means, by SQLSTATE.

use super::{expect_err, insert, job, one_shard, params, OWNER};
use shardq::shards::ShardSet;
use shardq::store::jobs;
use shardq::store::ErrorKind;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kind_classifies_lock_timeout_cancel_and_a_stopped_server() {
    let (pg, _config, set) = one_shard(
        "[dequeue]\nlock_timeout_ms = 300\nstatement_timeout_ms = 5000\nconnect_timeout_ms = 1000\n",
    )
    .await;
    let shard = set.get(0);
    let id = insert(shard, &[job("q", 0)]).await[0];

    // lock_timeout under a table lock.
    let mut locker = shard.user_client().await.unwrap();
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE workflow_status IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let started = Instant::now();
    let err = expect_err(jobs::get(shard, id).await, "get under a table lock");
    assert_eq!(err.kind(), ErrorKind::LockNotAvailable, "{err:?}");
    assert!(!err.is_permanent());
    assert!(started.elapsed() < Duration::from_secs(3));
    let err = expect_err(
        jobs::claim(shard, params("q", 10, OWNER)).await,
        "claim under a table lock",
    );
    assert_eq!(err.kind(), ErrorKind::LockNotAvailable, "{err:?}");

    // A statement the server cancels (pg_cancel_backend), through pools
    // without lock_timeout so it waits for the table lock.
    let waiting_config = pg.config("[dequeue]\nlock_timeout_ms = 0\nstatement_timeout_ms = 5000\n");
    let waiting_set = ShardSet::connect(&waiting_config).unwrap();
    let blocked = {
        let shard = waiting_set.get(0).clone();
        tokio::spawn(async move { jobs::get(&shard, id).await })
    };
    let canceller = shard.user_client().await.unwrap();
    let mut cancelled = false;
    for _ in 0..200 {
        let n: i64 = canceller
            .query_one(
                "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = 'shardq' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            cancelled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(cancelled, "no blocked statement to cancel");
    let err = expect_err(blocked.await.unwrap(), "cancelled statement");
    assert_eq!(err.kind(), ErrorKind::QueryCanceled, "{err:?}");
    assert!(!err.is_permanent());
    tx.rollback().await.unwrap();
    drop(locker);
    drop(canceller);

    // A stopped server.
    pg.servers[0]
        .stop(shardq_local::StopMode::Immediate)
        .unwrap();
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let err = expect_err(jobs::exists(shard, id).await, "stopped server");
        kinds.push(err.kind());
    }
    assert!(
        kinds
            .iter()
            .all(|k| matches!(k, ErrorKind::Unreachable | ErrorKind::NoAnswer)),
        "{kinds:?}"
    );
    assert_eq!(kinds.last(), Some(&ErrorKind::Unreachable), "{kinds:?}");
}

/// `ErrorKind::QueryCanceled` documents `statement_timeout` as its cause, and
/// `NoAnswer` as "the statement may have run". But `Shard::within` puts the
/// client-side deadline at the same `dequeue.statement_timeout_ms` and
/// starts it before the statement is sent, so it always fires first: a
/// server-cancelled statement is reported as `NoAnswer` (and its connection
/// abandoned mid-statement).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_timeout_is_query_canceled() {
    let (pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let id = insert(shard, &[job("q", 0)]).await[0];
    let mut locker = shard.user_client().await.unwrap();
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE workflow_status IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let config = pg.config("[dequeue]\nlock_timeout_ms = 0\nstatement_timeout_ms = 300\n");
    let timed = ShardSet::connect(&config).unwrap();
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let err = expect_err(jobs::get(timed.get(0), id).await, "statement_timeout");
        kinds.push(err.kind());
    }
    tx.rollback().await.unwrap();
    assert!(
        kinds.iter().all(|k| *k == ErrorKind::QueryCanceled),
        "{kinds:?}"
    );
}
