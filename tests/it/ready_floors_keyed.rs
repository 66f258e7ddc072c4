//! Keyed claims start at each queue's keyed ready floor (migrations 37-38,
//! migrations/functions/shardq_lock_keyed_ready.sql), as plain claims start
//! at theirs (`ready_floors`): while a long transaction holds the xmin
//! horizon, finding the heads of keys reads only what was claimed since
//! the floor last moved; and a keyed job ready again (released, or the
//! next of its key once the one before it finished) is numbered past the
//! floor and claimed.

use super::ready_floors::{claim, let_floors_move, shard, CLAIM};
use crate::common;
use tokio_postgres::GenericClient;

/// Inserts one ready job for each of the keys `{prefix}0 .. {prefix}n-1`
/// of `queue`; returns their ids.
async fn enqueue_keys(db: &impl GenericClient, queue: &str, prefix: &str, n: i64) -> Vec<i64> {
    db.query(
        "INSERT INTO workflow_status (shard_key, queue, handler, ordering_key) \
         SELECT g % 65536, $1, 'noop', $2 || g FROM generate_series(0, $3::bigint - 1) g \
         RETURNING id",
        &[&queue, &prefix, &n],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Index entries of every index of `workflow_status` read by `sql` (one
/// claim) in one transaction, and the rows it returned.
async fn entries_read(db: &mut tokio_postgres::Client, sql: &str, queue: &str) -> (i64, usize) {
    const RETURNED: &str = "SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid))::bigint \
        FROM pg_index WHERE indrelid = 'workflow_status'::regclass";
    let tx = db.transaction().await.unwrap();
    let before: i64 = tx.query_one(RETURNED, &[]).await.unwrap().get(0);
    let rows = tx.query(sql, &[&queue, &100i32]).await.unwrap().len();
    let after: i64 = tx.query_one(RETURNED, &[]).await.unwrap().get(0);
    tx.rollback().await.unwrap();
    (after - before, rows)
}

/// The collapse, for keyed jobs: a REPEATABLE READ snapshot held open
/// keeps the ready versions of 3,000 claimed keyed jobs (each of its own
/// key). A keyed claim of 100 new keys still reads about its batch of
/// index entries, where a claim that found its heads from the start of
/// the keyed ready index (before migration 37) read all 3,000 dead ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_held_snapshot_a_keyed_claim_reads_only_what_was_claimed_since_the_floor_moved() {
    let (shards, set) = shard().await;
    let mut db = set.get(0).client().await.unwrap();
    let holder = common::hold_snapshot(&shards.urls[0]).await;

    enqueue_keys(&***db, "q", "old-", 3_000).await;
    for _ in 0..30 {
        assert_eq!(claim(&db, "q", 100).await.len(), 100);
    }
    let_floors_move(&db).await;
    enqueue_keys(&***db, "q", "new-", 100).await;

    let (read, claimed) = entries_read(&mut db, CLAIM, "q").await;
    assert_eq!(claimed, 100);
    assert!(
        read <= 1_500,
        "a keyed claim of 100 keys read {read} index entries"
    );
    let from_start = "SELECT id FROM workflow_status WHERE queue = $1 AND status = 'queued' \
        AND ordering_key IS NOT NULL ORDER BY priority, ready_seq LIMIT $2::int";
    let (read, found) = entries_read(&mut db, from_start, "q").await;
    assert_eq!(found, 100);
    assert!(
        read >= 3_000,
        "the snapshot held the claimed jobs' versions: a walk from the start read {read}"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// A key's next job, parked behind the running one, is queued when that
/// one finishes, after the floors moved past its first number: it is
/// numbered again and claimed. A keyed job given back (as a late claim is)
/// after the floors moved is claimed again, in its key's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_jobs_ready_again_behind_the_floor_are_claimed_in_key_order() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    let first = enqueue_keys(&***db, "q", "k", 1).await[0];
    let second = enqueue_keys(&***db, "q", "k", 1).await[0];
    assert_eq!(claim(&db, "q", 1).await, vec![first]);
    assert_eq!(
        claim(&db, "q", 10).await,
        Vec::<i64>::new(),
        "the key is held: its second job waits"
    );
    let_floors_move(&db).await;

    db.batch_execute(&format!(
        "UPDATE workflow_status SET status = 'succeeded', finished_at = now() WHERE id = {first};
         SELECT shardq_promote_keys(ARRAY[shard_key], ARRAY[id]) FROM workflow_status
         WHERE id = {first};"
    ))
    .await
    .unwrap();
    let_floors_move(&db).await;
    assert_eq!(
        claim(&db, "q", 10).await,
        vec![second],
        "the key's next job"
    );

    // Given back after the floors moved: claimed again.
    let_floors_move(&db).await;
    db.execute(
        "UPDATE workflow_status SET status = 'queued', owner = NULL WHERE id = $1",
        &[&second],
    )
    .await
    .unwrap();
    let_floors_move(&db).await;
    assert_eq!(
        claim(&db, "q", 10).await,
        vec![second],
        "a released keyed job"
    );
}

/// The barrier, for keyed jobs: a transaction numbers a keyed job, then
/// stays open while later keyed jobs are claimed and the floors try to
/// move past it. The keyed floor waits for it; once it commits, its job
/// is claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_job_numbered_before_the_floor_moved_and_committed_after_is_claimed() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    let mut late = set.get(0).client().await.unwrap();
    enqueue_keys(&***db, "q", "early-", 5).await;
    claim(&db, "q", 5).await;
    let_floors_move(&db).await;

    let tx = late.transaction().await.unwrap();
    let held_back = enqueue_keys(&*tx, "q", "late-", 1).await[0];
    let mut after = enqueue_keys(&***db, "q", "after-", 20).await;
    let mut taken = claim(&db, "q", 50).await;
    taken.sort();
    after.sort();
    assert_eq!(taken, after, "the later jobs are claimed meanwhile");
    let_floors_move(&db).await;

    tx.commit().await.unwrap();
    assert_eq!(claim(&db, "q", 50).await, vec![held_back]);
}
