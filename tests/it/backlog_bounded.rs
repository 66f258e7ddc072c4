//! The backlog's bounded read (`sql::QUEUE_BACKLOG_BOUNDED`, what the
//! exporter reads when the full read runs past half its deadline): while a
//! long transaction holds the horizon, the full read's counts of `waiting`
//! and scheduled jobs walk the dead entry of every job that left those
//! states since; the bounded read reads none of those indexes and counts
//! the ready and running jobs as the full read does.

use crate::common;

use shardq::store::sql;
use std::collections::BTreeMap;

/// The indexes only the `waiting` and scheduled counts read.
const WAIT_INDEXES: [&str; 3] = [
    "workflow_status_key",
    "workflow_status_scheduled",
    "workflow_status_scheduled_by_kind",
];

/// `statement`'s counts by (queue, state) and the entries of
/// [`WAIT_INDEXES`] it met, in a transaction of its own.
async fn read(
    db: &mut tokio_postgres::Client,
    statement: &str,
) -> (BTreeMap<(String, String), i64>, i64) {
    let (rows, met) = crate::backlog::read_meeting(db, statement, None, &WAIT_INDEXES).await;
    let counts = rows
        .iter()
        .map(|r| ((r.get("queue"), r.get("state")), r.get("count")))
        .collect();
    (counts, met)
}

/// Under a held snapshot, 2,000 jobs left the `waiting` and scheduled
/// states (their entries kept); 5 wait, 3 are delayed, 7 are ready and 2
/// run. The full read counts all of them and meets the 2,000 dead
/// entries; the bounded read counts the same ready and running jobs and
/// meets no entry of those indexes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bounded_read_counts_ready_and_running_jobs_without_the_waits_indexes() {
    let (shards, set) = crate::ready_floors::shard().await;
    let mut object = set.get(0).client().await.unwrap();
    let db: &mut tokio_postgres::Client = &mut object;
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    db.batch_execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, ordering_key, status) \
             SELECT 7, 'b', 'noop', 'k' || (g % 10), 'waiting' FROM generate_series(1, 1000) g; \
         INSERT INTO workflow_status (shard_key, queue, handler, status, run_at) \
             SELECT 7, 'b', 'noop', 'scheduled', now() + interval '1 hour' \
             FROM generate_series(1, 1000) g; \
         UPDATE workflow_status SET status = 'cancelled', finished_at = now() \
             WHERE queue = 'b'; \
         INSERT INTO workflow_status (shard_key, queue, handler, ordering_key, status) \
             SELECT 7, 'b', 'noop', 'held' || g, 'waiting' FROM generate_series(1, 5) g; \
         INSERT INTO workflow_status (shard_key, queue, handler, status, run_at) \
             SELECT 7, 'b', 'noop', 'scheduled', now() + interval '1 hour' \
             FROM generate_series(1, 3) g; \
         INSERT INTO workflow_status (shard_key, queue, handler) \
             SELECT 7, 'b', 'noop' FROM generate_series(1, 9) g",
    )
    .await
    .unwrap();
    assert_eq!(crate::ready_floors::claim(db, "b", 2).await.len(), 2);

    let (full, met) = read(db, sql::QUEUE_BACKLOG).await;
    let count = |counts: &BTreeMap<(String, String), i64>, state: &str| {
        counts.get(&("b".into(), state.into())).copied()
    };
    for (state, n) in [
        ("waiting", 5),
        ("delayed", 3),
        ("queued", 7),
        ("running", 2),
    ] {
        assert_eq!(count(&full, state), Some(n), "{state}: {full:?}");
    }
    assert!(
        met >= 2_000,
        "the full read met {met} entries of the waits' indexes"
    );

    let (bounded, met) = read(db, sql::QUEUE_BACKLOG_BOUNDED).await;
    assert_eq!(met, 0, "the bounded read met entries of the waits' indexes");
    let expected: BTreeMap<(String, String), i64> = full
        .into_iter()
        .filter(|((_, state), _)| state == "queued" || state == "running")
        .collect();
    assert_eq!(bounded, expected);
    holder.batch_execute("COMMIT").await.unwrap();
}
