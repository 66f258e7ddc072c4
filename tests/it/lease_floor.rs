//! The lease floor (migration 51): the time before which no running
//! job's lease ends, which upkeep moves up (`upkeep::move_lease_floor`),
//! and from which every read of the running jobs (the backlog's running
//! count, `shardq check`'s windows, lease recovery) starts. While a long
//! transaction holds the horizon, the lease index keeps an expired entry
//! of every job run since; from the floor those are passed without being
//! read. And the floor never passes a job still running: one whose row a
//! completion was writing (then rolled back), one whose key another
//! session held, one claimed by a transaction open while the floor moved.
//! Its age, exported, shows a transaction that holds it back.

use crate::common;
use shardq::store::upkeep::{self, RecoveryStart};
use shardq::store::{backlog, horizon, sql};
use std::time::SystemTime;
use tokio_postgres::types::Type;

/// The indexes of running and ready jobs the reads below may walk.
const INDEXES: [&str; 4] = [
    "workflow_status_lease",
    "workflow_status_dequeue_plain",
    "workflow_status_ready_plain",
    "workflow_status_ready_keyed",
];

/// Entries of `indexes` that `statement` met, run with `params` in a
/// transaction rolled back.
async fn entries_read(
    db: &mut tokio_postgres::Client,
    indexes: &[&str],
    statement: &str,
    params: &[sql::Param<'_>],
) -> i64 {
    let tx = db.transaction().await.unwrap();
    let before = common::xact_stat(&tx, "tuples_returned", indexes).await;
    tx.query_typed(statement, params).await.unwrap();
    let read = common::xact_stat(&tx, "tuples_returned", indexes).await - before;
    tx.rollback().await.unwrap();
    read
}

/// Running jobs of `queue` on the shard, as the backlog read counts them.
async fn running(shard: &shardq::shards::Shard, queue: &str) -> i64 {
    backlog::read(shard, Some(queue))
        .await
        .unwrap()
        .first()
        .map_or(0, |q| q.depth.running)
}

/// Enqueues one job of `queue` (keyed by `key` when given) and claims it
/// with a lease that ended a minute ago (a negative length); returns its
/// id and lease.
async fn claimed_expired(
    db: &tokio_postgres::Client,
    queue: &str,
    key: Option<&str>,
) -> (i64, SystemTime) {
    db.execute(
        "SELECT shardq_enqueue($1, 'noop', p_ordering_key => $2)",
        &[&queue, &key],
    )
    .await
    .unwrap();
    db.execute(
        "SELECT * FROM shardq_claim(1, 0, $1, 1, 'w', -60000)",
        &[&queue],
    )
    .await
    .unwrap();
    let row = db
        .query_one(
            "SELECT id, lease_expires_at FROM workflow_status \
             WHERE queue = $1 AND status = 'running'",
            &[&queue],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// 3,000 jobs run under leases that ended a minute ago (a negative lease
/// length, so that no test waits for them to end), and
/// finished, while a snapshot was held: each left an expired entry in the
/// lease index. Before any pass the backlog's running count reads them
/// all; after a pass that caught up, it and the check's windows of running
/// rows read a handful, and still count the one job running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_the_running_jobs_start_at_the_lease_floor_under_a_held_snapshot() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let shard = set.get(0);
    let mut db = shard.client().await.unwrap();
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    db.batch_execute(
        "SELECT shardq_enqueue('q', 'noop') FROM generate_series(1, 3000); \
         SELECT count(*) FROM shardq_claim(1, 0, 'q', 3000, 'w', -60000); \
         UPDATE workflow_status SET status = 'succeeded', finished_at = now(), \
             owner = NULL, lease_expires_at = NULL WHERE queue = 'q' AND status = 'running'; \
         SELECT shardq_enqueue('q', 'noop'); \
         SELECT count(*) FROM shardq_claim(1, 0, 'q', 1, 'w', 60000)",
    )
    .await
    .unwrap();
    let queue = Some("q");
    let backlog_params = [(&queue as _, Type::TEXT)];
    let read = entries_read(&mut db, &INDEXES[..1], sql::QUEUE_BACKLOG, &backlog_params).await;
    assert!(read >= 3_000, "with no floor the count read {read} entries");
    assert_eq!(running(shard, "q").await, 1);

    // A move notes a candidate; one at least a step later makes it the
    // floor (no transaction that could write a lease before it is open).
    assert_eq!(upkeep::move_lease_floor(shard).await.unwrap(), None);
    assert!(after_a_step(shard).await.is_some());
    let read = entries_read(&mut db, &INDEXES[..1], sql::QUEUE_BACKLOG, &backlog_params).await;
    assert!(read <= 10, "from the floor the count read {read} entries");
    assert_eq!(
        running(shard, "q").await,
        1,
        "the running job still counted"
    );
    let (rows, shown, stale, up_to) = (100i64, 5i64, 0i64, 100i64);
    let read = entries_read(
        &mut db,
        &INDEXES[..1],
        sql::CHECK_JOB_STATE,
        &[(&rows, Type::INT8), (&shown, Type::INT8)],
    )
    .await;
    assert!(read <= 10, "the job-state window read {read} entries");
    let read = entries_read(
        &mut db,
        &INDEXES[..1],
        sql::CHECK_KEY_RUNNING_TWICE,
        &[(&shown, Type::INT8)],
    )
    .await;
    assert!(
        read <= 10,
        "the keys-running-twice window read {read} entries"
    );
    let read = entries_read(
        &mut db,
        &INDEXES[..1],
        sql::CHECK_LEASE_NOT_RECOVERED,
        &[
            (&stale, Type::INT8),
            (&up_to, Type::INT8),
            (&shown, Type::INT8),
        ],
    )
    .await;
    assert!(read <= 10, "the lease window read {read} entries");

    holder.batch_execute("COMMIT").await.unwrap();
}

/// A session on shard 0 of `shards`.
async fn session(shards: &common::TestShards) -> tokio_postgres::Client {
    common::connect(&shards.urls[0]).await
}

/// A move of the lease floor, once a step has passed since the last (so
/// that a candidate noted then may become the floor): the floor after it.
async fn after_a_step(shard: &shardq::shards::Shard) -> Option<SystemTime> {
    tokio::time::sleep(upkeep::LEASE_FLOOR_STEP + std::time::Duration::from_millis(100)).await;
    upkeep::move_lease_floor(shard).await.unwrap()
}

/// A move of the floor never passes a running job's lease: while a
/// completion writing one's row is open, the floor does not move at all
/// (it might have written a lease); once it has rolled back, the floor
/// stops at that job's lease, and after recovery returns it, at the next
/// job, left for its key. Each stays counted running until a pass from
/// the floor recovers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_never_passes_a_job_still_running() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let shard = set.get(0);
    let db = shard.client().await.unwrap();
    let (row_id, row_lease) = claimed_expired(&db, "rows", None).await;
    let (_, key_lease) = claimed_expired(&db, "keys", Some("k")).await;
    // A completion writing the row: it holds the row's lock.
    let completion = session(&shards).await;
    completion
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM workflow_status WHERE id = {row_id} FOR UPDATE"
        ))
        .await
        .unwrap();
    // A session holding the key's lock.
    let key_holder = session(&shards).await;
    key_holder
        .batch_execute("SELECT pg_advisory_lock(shardq_key_lock('keys', 'k'))")
        .await
        .unwrap();

    assert_eq!(upkeep::move_lease_floor(shard).await.unwrap(), None);
    assert_eq!(after_a_step(shard).await, None, "the completion is open");
    completion.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        after_a_step(shard).await,
        Some(row_lease),
        "stops at the row's job"
    );
    for queue in ["rows", "keys"] {
        assert_eq!(
            running(shard, queue).await,
            1,
            "{queue} still counted running"
        );
    }

    let pass = upkeep::recover(shard, 100, RecoveryStart::LeaseFloor)
        .await
        .unwrap();
    assert_eq!(
        pass.recovered.requeued, 1,
        "the rolled-back row's job: {pass:?}"
    );
    assert_eq!(
        pass.oldest_left,
        Some(key_lease),
        "left for its key: {pass:?}"
    );
    assert_eq!(
        after_a_step(shard).await,
        Some(key_lease),
        "stops at the key's job"
    );
    assert_eq!(running(shard, "keys").await, 1, "still counted running");
    key_holder
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .await
        .unwrap();
    let last = upkeep::recover(shard, 100, RecoveryStart::LeaseFloor)
        .await
        .unwrap();
    assert_eq!(last.recovered.requeued, 1, "the key's job: {last:?}");
    for queue in ["rows", "keys"] {
        assert_eq!(running(shard, queue).await, 0, "{queue} recovered");
    }
}

/// A claim whose transaction is open while the floor moves is seen only
/// after, with a lease that may end before that move (here: lease 0): a
/// candidate noted while it is open does not become the floor until it
/// ends, so once it commits, the job is counted running from the floor,
/// and a pass from the floor recovers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_open_while_the_floor_moves_stays_past_it() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let shard = set.get(0);
    let db = shard.client().await.unwrap();
    assert_eq!(upkeep::move_lease_floor(shard).await.unwrap(), None);
    assert!(
        after_a_step(shard).await.is_some(),
        "a floor before the claim"
    );
    db.execute("SELECT shardq_enqueue('open', 'noop')", &[])
        .await
        .unwrap();
    let claimer = session(&shards).await;
    claimer
        .batch_execute("BEGIN; SELECT count(*) FROM shardq_claim(1, 0, 'open', 1, 'w', 0)")
        .await
        .unwrap();

    // The candidate noted before the claim may become the floor; the one
    // noted while it is open may not.
    let floor = after_a_step(shard).await.expect("a floor");
    assert_eq!(after_a_step(shard).await, Some(floor), "held at {floor:?}");

    claimer.batch_execute("COMMIT").await.unwrap();
    assert_eq!(running(shard, "open").await, 1, "counted running");
    let pass = upkeep::recover(shard, 100, RecoveryStart::LeaseFloor)
        .await
        .unwrap();
    assert_eq!(pass.recovered.requeued, 1, "{pass:?}");
}

/// The floor's age, as the exporter and `shardq status` read it: absent
/// before the first floor, then `now() - floor`. While a transaction that
/// took an id stays open, the floor stops (after promoting the candidate
/// noted before it began) and its age grows by every step; once it ends,
/// the floor moves again and, a step later, the age falls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_age_grows_while_a_transaction_with_an_id_is_open() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let shard = set.get(0);
    let age = || async { horizon::read(shard).await.unwrap().lease_floor_age_s };
    assert_eq!(age().await, None, "no floor yet");
    assert_eq!(upkeep::move_lease_floor(shard).await.unwrap(), None);
    let floor = after_a_step(shard).await.expect("a floor");
    let first = age().await.expect("an age");
    let since = SystemTime::now().duration_since(floor).unwrap();
    assert!(
        (first - since.as_secs_f64()).abs() < 1.0,
        "age {first} s, floor {since:?} ago"
    );

    let writer = session(&shards).await;
    writer
        .batch_execute("BEGIN; SELECT pg_current_xact_id()")
        .await
        .unwrap();
    let held = after_a_step(shard).await.expect("the candidate before it");
    let held_age = age().await.unwrap();
    assert_eq!(after_a_step(shard).await, Some(held), "stopped");
    assert_eq!(after_a_step(shard).await, Some(held), "stopped");
    let grown = age().await.unwrap();
    let steps = 2.0 * upkeep::LEASE_FLOOR_STEP.as_secs_f64();
    assert!(
        grown >= held_age + steps,
        "{grown} s after two steps, {held_age} s before"
    );

    writer.batch_execute("COMMIT").await.unwrap();
    // The first move after it takes the candidate noted while it was open
    // (about as old by now as the stopped floor was); the next one, the
    // candidate noted after it ended.
    let moved = after_a_step(shard).await.expect("a floor");
    assert!(moved > held, "moves again once it ended");
    let caught_up = after_a_step(shard).await.expect("a floor");
    assert!(caught_up > moved, "and keeps moving");
    let after = age().await.unwrap();
    assert!(after < grown, "{after} s after, {grown} s while held");
}

/// Each read of the running jobs walks the lease index from the floor: an
/// index condition, not a filter over the whole index, with as many live
/// running jobs as a busy shard holds (the planner's choice follows them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_read_of_the_running_jobs_starts_the_lease_index_at_the_floor() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let shard = set.get(0);
    let db = shard.client().await.unwrap();
    db.batch_execute(
        "SELECT shardq_enqueue('q', 'noop', p_ordering_key => 'k' || (g % 50)) \
             FROM generate_series(1, 3000) g; \
         SELECT shardq_enqueue('q', 'noop') FROM generate_series(1, 3000); \
         SELECT count(*) FROM shardq_claim(1, 0, 'q', 3000, 'w', 60000); \
         ANALYZE workflow_status",
    )
    .await
    .unwrap();
    upkeep::move_lease_floor(shard).await.unwrap();
    assert!(after_a_step(shard).await.is_some());

    let queue = Some("q");
    let (n, shown, stale) = (100i64, 5i64, 0i64);
    let reads: [(&str, &str, Vec<sql::Param>); 6] = [
        ("backlog", sql::QUEUE_BACKLOG, vec![(&queue, Type::TEXT)]),
        (
            "pending",
            sql::QUEUE_HAS_PENDING,
            vec![(&queue, Type::TEXT)],
        ),
        (
            "job state",
            sql::CHECK_JOB_STATE,
            vec![(&n, Type::INT8), (&shown, Type::INT8)],
        ),
        (
            "keys running twice",
            sql::CHECK_KEY_RUNNING_TWICE,
            vec![(&shown, Type::INT8)],
        ),
        (
            "leases not recovered",
            sql::CHECK_LEASE_NOT_RECOVERED,
            vec![(&stale, Type::INT8), (&n, Type::INT8), (&shown, Type::INT8)],
        ),
        (
            "missing parents",
            sql::CHECK_PARENT_MISSING,
            vec![(&n, Type::INT8), (&n, Type::INT8), (&shown, Type::INT8)],
        ),
    ];
    for (name, statement, params) in reads {
        let plan: Vec<String> = db
            .query_typed(&format!("EXPLAIN {statement}"), &params)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        let bounded = |line: &&String| line.contains("lease_expires_at >= COALESCE");
        let conditions: Vec<&String> = plan.iter().filter(bounded).collect();
        assert!(
            !conditions.is_empty(),
            "{name}: no floor in\n{}",
            plan.join("\n")
        );
        assert!(
            conditions.iter().all(|line| line.contains("Index Cond")),
            "{name}: the floor is not an index condition in\n{}",
            plan.join("\n")
        );
    }
}
