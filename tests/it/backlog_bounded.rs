//! The backlog's bounded read (`sql::QUEUE_BACKLOG_BOUNDED`, what every
//! reader of queue depth reads when the full read runs past half its
//! deadline): while a
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

/// Dead entries left in the scheduled indexes under a hold, per round:
/// about 0.25 µs each for the full read on a 2-core host.
const DEAD_SCHEDULED: i64 = 1_000_000;

/// The shards' statement deadline in the readers' test: the full read may
/// take half of the client's deadline (a quarter longer), about 100 ms.
const SHORT_STATEMENT_MS: u64 = 160;

/// How long the full read must take, at least, before the readers are
/// asked: 3× its share of [`SHORT_STATEMENT_MS`]'s deadline (more rounds
/// of dead entries on a faster host).
const FULL_READ_AT_LEAST: std::time::Duration = std::time::Duration::from_millis(300);

/// `shardq status`, `Client::depth` and the dashboard's overview read a
/// shard's backlog within its deadline: while a hold keeps the dead
/// entries of a million jobs or more that left the scheduled state (as
/// many as make the full read take 3× its share), the full read
/// runs past its share and each reader still answers, with the ready and
/// running jobs counted and the shard named as bounded; once vacuum can
/// remove those entries, the same readers count every state again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_depth_and_the_overview_answer_bounded_while_the_full_read_runs_long() {
    use shardq::client::{ListState, OverviewOptions};
    use shardq::shards::ShardSet;
    use shardq::Client;
    use std::time::Duration;

    let shards = common::TestShards::databases(1).await;
    let setup = shards.migrated(&shards.config("")).await;
    let short_settings = format!(
        "[database]\nstatement_timeout_ms = {SHORT_STATEMENT_MS}\n\
         [dequeue]\nclaim_budget_max_ms = 100\n"
    );
    let short = shards.config(&short_settings);
    let client = Client::from_shards(ShardSet::connect(&short).unwrap(), short.limits.clone());
    let name = setup.get(0).name.clone();
    let db = common::connect(&shards.urls[0]).await;
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    let no_queue: Option<&str> = None;
    for round in 1..=4 {
        db.batch_execute(&format!(
            "INSERT INTO workflow_status (shard_key, queue, handler, status, run_at) \
                 SELECT 7, 'b', 'noop', 'scheduled', now() + interval '1 hour' \
                 FROM generate_series(1, {DEAD_SCHEDULED}); \
             UPDATE workflow_status SET status = 'succeeded', \
                 finished_at = now() - interval '1 hour' \
                 WHERE queue = 'b' AND status = 'scheduled'"
        ))
        .await
        .unwrap();
        let started = std::time::Instant::now();
        db.query(sql::QUEUE_BACKLOG, &[&no_queue]).await.unwrap();
        let took = started.elapsed();
        if took >= FULL_READ_AT_LEAST {
            break;
        }
        assert!(
            round < 4,
            "the full read took {took:?} over {round} million dead entries"
        );
    }
    db.batch_execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, ordering_key, status) \
             SELECT 7, 'b', 'noop', 'k' || g, 'waiting' FROM generate_series(1, 5) g; \
         INSERT INTO workflow_status (shard_key, queue, handler, status, run_at) \
             SELECT 7, 'b', 'noop', 'scheduled', now() + interval '1 hour' \
             FROM generate_series(1, 3); \
         INSERT INTO workflow_status (shard_key, queue, handler) \
             SELECT 7, 'b', 'noop' FROM generate_series(1, 9); \
         ANALYZE workflow_status",
    )
    .await
    .unwrap();
    assert_eq!(crate::ready_floors::claim(&db, "b", 2).await.len(), 2);
    let overview = OverviewOptions {
        deadline: Duration::from_millis(2 * SHORT_STATEMENT_MS),
        ..OverviewOptions::default()
    };
    let of_b = |counts: &[shardq::client::QueueCount]| {
        let mut b: Vec<(String, i64)> = counts
            .iter()
            .filter(|c| c.queue == "b")
            .map(|c| (c.status.clone(), c.count))
            .collect();
        b.sort();
        b
    };
    let pairs = |list: &[(&str, i64)]| -> Vec<(String, i64)> {
        list.iter().map(|(s, n)| (s.to_string(), *n)).collect()
    };

    let depth = client.depth("b").await.unwrap();
    assert_eq!(depth.bounded, vec![name.clone()], "{:?}", depth.failed);
    assert!(!depth.complete());
    assert_eq!((depth.counts.queued, depth.counts.running), (7, 2));
    assert_eq!((depth.counts.waiting, depth.counts.delayed), (0, 0));
    let status = client.status().await.remove(0);
    assert!(status.backlog_bounded, "{:?}", status.error);
    let counts = status.counts.expect("answered");
    assert_eq!(of_b(&counts), pairs(&[("queued", 7), ("running", 2)]));
    let page = client.overview(&overview).await.remove(0);
    assert!(page.bounded, "{:?}", page.error);
    let b = page.queues.iter().find(|q| q.queue == "b").expect("b");
    assert_eq!(
        (b.count(ListState::Ready), b.count(ListState::Running)),
        (7, 2)
    );
    assert_eq!(b.count(ListState::Scheduled), 0);
    // `shardq status` itself: the shard named, and the columns its read
    // left out (ready, scheduled, retrying, running, waiting, parked, …)
    // marked as at least.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml(&short_settings)).unwrap();
    let (ok, out) = shardq_harness::exe::shardq_output(&path, &["status"]).await;
    assert!(ok, "{out}");
    assert!(out.contains("ready and running jobs only"), "{out}");
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("b "))
        .unwrap_or_else(|| panic!("no row for b:\n{out}"))
        .split_whitespace()
        .collect();
    assert_eq!(row[1..7], ["7", "0+", "0+", "2", "0+", "0+"], "{out}");

    // The hold ends and vacuum removes the dead entries: every state again
    // (asked with the default deadline: the full read has to answer).
    holder.batch_execute("COMMIT").await.unwrap();
    db.batch_execute("VACUUM workflow_status").await.unwrap();
    let client = Client::from_shards(setup.clone(), short.limits.clone());
    let overview = OverviewOptions::default();
    let depth = client.depth("b").await.unwrap();
    assert!(depth.complete(), "{:?} {:?}", depth.bounded, depth.failed);
    assert_eq!(
        (
            depth.counts.queued,
            depth.counts.running,
            depth.counts.waiting,
            depth.counts.delayed
        ),
        (7, 2, 5, 3)
    );
    let status = client.status().await.remove(0);
    assert!(!status.backlog_bounded, "{:?}", status.error);
    let counts = status.counts.expect("answered");
    assert_eq!(
        of_b(&counts),
        pairs(&[
            ("delayed", 3),
            ("queued", 7),
            ("running", 2),
            ("waiting", 5)
        ])
    );
    let page = client.overview(&overview).await.remove(0);
    assert!(!page.bounded, "{:?}", page.error);
    let b = page.queues.iter().find(|q| q.queue == "b").expect("b");
    assert_eq!(
        (b.count(ListState::Scheduled), b.count(ListState::Waiting)),
        (3, 5)
    );
}
