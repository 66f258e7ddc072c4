//! The checks' windows of ready jobs while a long transaction holds the
//! horizon: the child checks' (`unfinished_windows!` in check_waits.rs)
//! and the job-state read's that the check falls back to
//! (`CHECK_JOB_STATE_FROM_FLOORS`) read ready jobs without a group from
//! the queues' ready floors, as the claims find them, and the child
//! checks' grouped ones from their queue's grouped floor. From the start
//! of the ready indexes, every job claimed since the hold began was an
//! entry to pass, in every check.

use crate::common;
use shardq::store::sql;
use tokio_postgres::types::Type;

/// The ready indexes the windows may walk, those of the dequeue order
/// and the groups' lines too.
const READY_INDEXES: [&str; 6] = [
    "workflow_status_dequeue_plain",
    "workflow_status_dequeue_keyed",
    "workflow_status_ready_plain",
    "workflow_status_ready_keyed",
    "workflow_status_ready_grouped",
    "workflow_status_group_lines",
];

/// 2,000 plain and 2,000 keyed jobs of one queue and 2,000 grouped ones
/// of another claimed while a snapshot is held (returned; the session
/// holding it), the floors moved past them, 10 of each ready.
async fn claimed_under_a_held_snapshot(
    shards: &common::TestShards,
    db: &tokio_postgres::Client,
) -> tokio_postgres::Client {
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    db.batch_execute(
        "SELECT shardq_enqueue('q', 'noop') FROM generate_series(1, 2000); \
         SELECT shardq_enqueue('q', 'noop', p_ordering_key => 'k' || g) \
             FROM generate_series(1, 2000) g; \
         SELECT shardq_enqueue('gq', 'noop', p_group => 'g' || (g % 20)) \
             FROM generate_series(1, 2000) g; \
         SELECT count(*) FROM shardq_claim(1, 0, 'q', 4000, 'w', 60000); \
         SELECT count(*) FROM shardq_claim(1, 0, 'gq', 2000, 'w', 60000)",
    )
    .await
    .unwrap();
    let claimed: i64 = db
        .query_one(
            "SELECT count(*) FROM workflow_status WHERE status = 'running'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(claimed, 6000);
    for _ in 0..3 {
        crate::ready_floors::move_now(db).await;
    }
    db.batch_execute(
        "SELECT shardq_enqueue('q', 'noop') FROM generate_series(1, 10); \
         SELECT shardq_enqueue('q', 'noop', p_ordering_key => 'new' || g) \
             FROM generate_series(1, 10) g; \
         SELECT shardq_enqueue('gq', 'noop', p_group => 'new' || g) \
             FROM generate_series(1, 10) g",
    )
    .await
    .unwrap();
    holder
}

/// The entries of the ready indexes `statement` met, and the rows it
/// says it read (`scanned`), in a transaction rolled back.
async fn ready_entries_met(
    db: &mut tokio_postgres::Client,
    statement: &str,
    params: &[sql::Param<'_>],
) -> (i64, i64) {
    let tx = db.transaction().await.unwrap();
    let before = common::xact_stat(&tx, "tuples_returned", &READY_INDEXES).await;
    let row = tx.query_typed(statement, params).await.unwrap();
    let met = common::xact_stat(&tx, "tuples_returned", &READY_INDEXES).await - before;
    let scanned: i64 = row[0].get("scanned");
    tx.rollback().await.unwrap();
    (met, scanned)
}

/// A check of missing parents meets a few dozen entries of the ready
/// indexes, and still reads the 30 ready jobs. With windows from each
/// index's start it met over 6,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_child_checks_read_ready_jobs_from_the_floors_under_a_held_snapshot() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let mut db = set.get(0).client().await.unwrap();
    let holder = claimed_under_a_held_snapshot(&shards, &db).await;
    let (rows, retention_ms, shown) = (100i64, 86_400_000i64, 5i64);
    let params = [
        (&rows as _, Type::INT8),
        (&retention_ms as _, Type::INT8),
        (&shown as _, Type::INT8),
    ];
    let (met, scanned) = ready_entries_met(&mut db, sql::CHECK_PARENT_MISSING, &params).await;
    assert!(met <= 100, "the windows met {met} ready entries");
    // 6,000 running and 30 ready rows read.
    assert_eq!(scanned, 6030);
    holder.batch_execute("COMMIT").await.unwrap();
}

/// The job-state check reads its ready jobs from the floors too, beside
/// windows from each index's start (only there is a job below its floor
/// met), which meet every entry claimed since: the read without them
/// (what the check falls back to past its share of the deadline,
/// `store::check`) meets a few dozen, and still judges the 20 ready jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_state_read_from_the_floors_passes_what_was_claimed_under_a_held_snapshot() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let mut db = set.get(0).client().await.unwrap();
    let holder = claimed_under_a_held_snapshot(&shards, &db).await;
    let (rows, shown) = (100i64, 5i64);
    let params = [(&rows as _, Type::INT8), (&shown as _, Type::INT8)];
    let (met, scanned) =
        ready_entries_met(&mut db, sql::CHECK_JOB_STATE_FROM_FLOORS, &params).await;
    assert!(met <= 100, "from the floors: {met} ready entries");
    // 6,000 running, 20 ready from the floors, the 100 newest jobs.
    assert_eq!(scanned, 6120, "rows judged");
    let (met, _) = ready_entries_met(&mut db, sql::CHECK_JOB_STATE, &params).await;
    assert!(met >= 6000, "from each index's start: {met} ready entries");
    holder.batch_execute("COMMIT").await.unwrap();
}
