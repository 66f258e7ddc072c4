//! The backlog's count of grouped ready jobs while a long transaction holds
//! the xmin horizon: each queue's from its grouped floor (where its claims
//! walk from), the queues never claimed from found between the claimed
//! ones, and the jobs not yet given a turn, without walking the entries of
//! the grouped jobs claimed since the hold began.

use crate::common;

use shardq::store::sql;
use std::collections::BTreeMap;

const GROUPED_INDEX: &str = "workflow_status_ready_grouped";

/// Enqueues `n` grouped jobs of `queue`, in `groups` groups.
async fn enqueue_grouped(db: &tokio_postgres::Client, queue: &str, n: i64, groups: i64) {
    db.execute(
        "SELECT shardq_enqueue($1, 'noop', p_group => 'g' || (g % $3)) \
         FROM generate_series(1, $2::bigint) g",
        &[&queue, &n, &groups],
    )
    .await
    .unwrap();
}

async fn claim_all(db: &tokio_postgres::Client, queue: &str, n: i32) {
    for _ in 0..n / 100 {
        assert_eq!(crate::ready_floors::claim(db, queue, 100).await.len(), 100);
    }
}

/// The backlog read of `queue` (all when `None`) in a transaction of its
/// own: each queue's ready count and oldest ready age, and the entries of
/// the grouped ready index it met.
async fn read(
    db: &mut tokio_postgres::Client,
    queue: Option<&str>,
) -> (BTreeMap<String, (i64, Option<f64>)>, i64) {
    let (rows, met) =
        crate::backlog::read_meeting(db, sql::QUEUE_BACKLOG, queue, &[GROUPED_INDEX]).await;
    let ready = rows
        .iter()
        .filter(|r| r.get::<_, &str>("state") == "queued")
        .map(|r| (r.get("queue"), (r.get("count"), r.get("oldest_ready_s"))))
        .collect();
    (ready, met)
}

/// Before any claim (no grouped floor yet), every queue is found by the
/// walk of the index's queues. Then two queues are claimed from under a
/// held snapshot (3,000 and 1,000 grouped jobs claimed, their entries
/// kept), and four never claimed from lie before the first claimed queue,
/// between the two (two of them) and after the last. Every queue's ready
/// jobs are counted, a job enqueued under REPEATABLE READ (no turn yet)
/// too, for all queues and for each by name; the read meets about one
/// entry per ready job, where a count of the first queue from the index's
/// start meets its 3,000 claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_held_snapshot_grouped_jobs_are_counted_from_their_floors() {
    let (shards, set) = crate::ready_floors::shard().await;
    let mut object = set.get(0).client().await.unwrap();
    let db: &mut tokio_postgres::Client = &mut object;
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    enqueue_grouped(db, "gb", 3_100, 30).await;
    enqueue_grouped(db, "gd", 1_050, 10).await;
    let (before_claims, _) = read(db, None).await;
    let counts: Vec<(&str, i64)> = before_claims
        .iter()
        .map(|(q, (n, _))| (q.as_str(), *n))
        .collect();
    assert_eq!(counts, [("gb", 3_100), ("gd", 1_050)], "before any claim");
    claim_all(db, "gb", 3_000).await;
    claim_all(db, "gd", 1_000).await;
    enqueue_grouped(db, "ga", 40, 4).await;
    enqueue_grouped(db, "gc", 30, 3).await;
    enqueue_grouped(db, "gca", 10, 1).await;
    enqueue_grouped(db, "gz", 20, 2).await;
    // The grouped floors brought up to the first ready turns.
    for _ in 0..3 {
        crate::ready_floors::move_now(db).await;
    }
    db.batch_execute(
        "BEGIN ISOLATION LEVEL REPEATABLE READ; \
         SELECT shardq_enqueue('gb', 'noop', p_group => 'late'); COMMIT",
    )
    .await
    .unwrap();
    let unnumbered: i64 = db
        .query_one(
            "SELECT count(*) FROM workflow_status \
             WHERE queue = 'gb' AND status = 'queued' AND turn IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        unnumbered, 1,
        "a job enqueued under REPEATABLE READ has no turn yet"
    );

    let expected = [
        ("ga", 40),
        ("gb", 101),
        ("gc", 30),
        ("gca", 10),
        ("gd", 50),
        ("gz", 20),
    ];
    let (all, met) = read(db, None).await;
    let counts: Vec<(&str, i64)> = all.iter().map(|(q, (n, _))| (q.as_str(), *n)).collect();
    assert_eq!(counts, expected);
    assert!(
        all.values()
            .all(|(_, oldest)| oldest.is_some_and(|s| s >= 0.0)),
        "each queue's oldest ready job is aged: {all:?}"
    );
    let ready: i64 = expected.iter().map(|(_, n)| n).sum();
    assert!(
        (ready..=2 * ready).contains(&met),
        "the backlog met {met} entries of the grouped index for {ready} ready jobs"
    );
    for (queue, n) in expected {
        let (one, met) = read(db, Some(queue)).await;
        let counts: Vec<(&str, i64)> = one.iter().map(|(q, (n, _))| (q.as_str(), *n)).collect();
        assert_eq!(counts, [(queue, n)]);
        assert!(
            (n..=2 * n).contains(&met),
            "{queue}: {met} entries met for {n} ready jobs"
        );
    }

    // What the count from the index's start met with the same snapshot held.
    let tx = db.transaction().await.unwrap();
    let before = common::xact_stat(&tx, "tuples_returned", &[GROUPED_INDEX]).await;
    let counted: i64 = tx
        .query_one(
            "SELECT count(*) FROM workflow_status \
             WHERE queue = 'gb' AND status = 'queued' AND job_group IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let met = common::xact_stat(&tx, "tuples_returned", &[GROUPED_INDEX]).await - before;
    tx.rollback().await.unwrap();
    assert_eq!(counted, 101);
    assert!(met >= 3_000, "a count from the start met {met}");
    holder.batch_execute("COMMIT").await.unwrap();
}
