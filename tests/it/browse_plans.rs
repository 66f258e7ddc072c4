//! The dashboard's reads go through the partial index of the state they
//! read, with a history of finished rows, fresh statistics and a vacuumed
//! table: no list, count or chart walks the table or the succeeded history.

use crate::common;

use common::TestShards;
use shardq::store::sql;
use std::time::Duration;
use tokio_postgres::types::{ToSql, Type};

/// Rows in every state; most of them succeeded history.
const FILL: &str = "
INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at)
    SELECT 0, 'q', 'noop', 'succeeded', 1, now() - interval '1 hour' * random()
    FROM generate_series(1, 30000);
INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at, error)
    SELECT 0, 'q', 'noop', 'dead', 1, now() - interval '1 hour' * random(), 'boom'
    FROM generate_series(1, 5000);
INSERT INTO workflow_status (shard_key, queue, handler, status, priority)
    SELECT 0, 'q', 'noop', 'queued', g % 3 FROM generate_series(1, 300) g;
INSERT INTO workflow_status (shard_key, queue, handler, status, ordering_key)
    SELECT 0, 'q', 'noop', 'waiting', 'k' || (g % 10) FROM generate_series(1, 100) g;
INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, run_at)
    SELECT 0, 'q', 'noop', 'scheduled', g % 2, now() + interval '1 hour' FROM generate_series(1, 200) g;
INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, owner, lease_expires_at)
    SELECT 0, 'q', 'noop', 'running', 1, 'w', now() + interval '1 minute' FROM generate_series(1, 100);
ANALYZE workflow_status;
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dashboard_read_uses_the_partial_index_of_its_state() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    // A connection of shardq's own pool: it carries the planner settings.
    let db = set.get(0).client().await.unwrap();
    db.batch_execute(FILL).await.unwrap();
    // As autovacuum leaves it: the visibility map set (index-only scans).
    db.batch_execute("VACUUM workflow_status").await.unwrap();

    let none: Option<String> = None;
    let after: Option<String> = Some(String::new());
    let (text2, num, id, limit) = (String::new(), 0i64, 0i64, 50i64);
    let lists = [
        (
            sql::JOBS_READY,
            "",
            vec![
                "workflow_status_dequeue_plain",
                "workflow_status_dequeue_keyed",
                // Either index of ready grouped jobs (by turn, or by group
                // and turn).
                "workflow_status_ready_grouped|workflow_status_group_lines",
            ],
        ),
        (sql::JOBS_WAITING, "", vec!["workflow_status_key"]),
        // Either index of scheduled rows (by run_at, or by queue and
        // attempts): which one the planner takes depends on how many are
        // delayed and how many retrying.
        (
            sql::JOBS_SCHEDULED,
            "retrying",
            vec!["workflow_status_scheduled*"],
        ),
        (
            sql::JOBS_SCHEDULED,
            "scheduled",
            vec!["workflow_status_scheduled*"],
        ),
        (sql::JOBS_RUNNING, "", vec!["workflow_status_lease"]),
        (
            sql::JOBS_FINISHED,
            "succeeded",
            vec!["workflow_status_finished"],
        ),
        // Either index of failed states (by finish, or by state and
        // queue), as many rows of the state there are.
        (sql::JOBS_FINISHED, "dead", vec!["workflow_status_failed*"]),
        (
            sql::JOBS_FINISHED,
            "cancelled",
            vec!["workflow_status_failed*"],
        ),
    ];
    for (statement, variant, indexes) in lists {
        // First pages and later pages (a position given) alike.
        for position in [&none, &after] {
            let params: [(&(dyn ToSql + Sync), Type); 9] = [
                (&none, Type::TEXT),
                (&none, Type::TEXT),
                (&none, Type::TEXT),
                (position, Type::TEXT),
                (&text2, Type::TEXT),
                (&num, Type::INT8),
                (&id, Type::INT8),
                (&limit, Type::INT8),
                (&variant, Type::TEXT),
            ];
            let plan = explain(&db, statement, &params).await;
            for index in &indexes {
                let uses = index.split('|').any(|index| match index.strip_suffix('*') {
                    Some(prefix) => plan.contains(&format!(" {prefix}")),
                    None => plan.contains(&format!(" {index} ")),
                });
                assert!(uses, "{variant} should read {index}:\n{plan}");
            }
            assert!(!plan.contains("Seq Scan"), "{variant}:\n{plan}");
        }
    }
    let (bucket, window) = (10i64, 300i64);
    let plan = explain(
        &db,
        sql::COMPLETIONS_RECENT,
        &[(&bucket, Type::INT8), (&window, Type::INT8)],
    )
    .await;
    assert!(
        plan.contains("workflow_status_finished") && plan.contains("Index Cond: (finished_at >="),
        "{plan}"
    );
    let since: Option<chrono::DateTime<chrono::Utc>> = None;
    let span_ms = 30_000i64;
    let plan = explain(
        &db,
        sql::FINISHED_SINCE,
        &[(&since, Type::TIMESTAMPTZ), (&span_ms, Type::INT8)],
    )
    .await;
    assert!(
        plan.contains("workflow_status_finished") && !plan.contains("Seq Scan"),
        "the trend reads a range of the finished index: {plan}"
    );
    let limit = 10_001i64;
    let plan = explain(&db, sql::FAILED_COUNTS, &[(&limit, Type::INT8)]).await;
    // The first pair, each next pair, each pair's count: three scans of
    // that index, in its order (no bitmap; the one sort is of the pairs
    // counted, by queue).
    let sorts: Vec<&str> = plan.lines().filter(|l| l.contains("Sort Key")).collect();
    assert!(
        plan.matches("Index Only Scan using workflow_status_failed_queue")
            .count()
            == 3
            && sorts.iter().all(|l| l.contains("Sort Key: pairs.queue"))
            && !["Seq Scan", "Bitmap", "workflow_status_failed "]
                .iter()
                .any(|s| plan.contains(s)),
        "the dead, failed and cancelled counts read their index alone: {plan}"
    );
    let queue = "q";
    let (day, per_shard) = (86_400i64, 1_000i64);
    let plan = explain(
        &db,
        sql::FAILURES_BY_ERROR,
        &[
            (&queue, Type::TEXT),
            (&day, Type::INT8),
            (&per_shard, Type::INT8),
        ],
    )
    .await;
    assert!(
        plan.contains("workflow_status_failed") && !plan.contains("Seq Scan"),
        "failures by error read the failed index: {plan}"
    );
    let plan = explain(&db, sql::QUEUE_OLDEST_READY, &[(&queue, Type::TEXT)]).await;
    assert!(
        plan.contains("workflow_status_dequeue_plain ")
            && (plan.contains("workflow_status_ready_grouped ")
                || plan.contains("workflow_status_group_lines "))
            && !plan.contains("Seq Scan"),
        "{plan}"
    );
}

async fn explain(
    db: &tokio_postgres::Client,
    statement: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> String {
    let rows = db
        .query_typed(&format!("EXPLAIN {statement}"), params)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e:?}"));
    rows.iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Two hours of completions, about 28 a second, a tenth of them dead.
const HISTORY: &str = "
INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at)
    SELECT 0, 'q', 'noop', CASE WHEN g % 10 = 0 THEN 'dead' ELSE 'succeeded' END, 1,
        now() - interval '2 hours' * random()
    FROM generate_series(1, 200000) g;
ANALYZE workflow_status;
";

/// The trend read after a long gap (the dashboard's sampler could not reach
/// the shard for an hour): it reads only the last span before its end and
/// says where that span started, so the shard answers at once with a
/// current count (not an hour-old one, nor the whole hour: a read that grew
/// with the gap would miss its deadline, and every later one too); the next
/// read goes on from its end, each job counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trend_read_after_a_long_gap_reads_its_last_span_and_the_next_goes_on() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let db = set.get(0).client().await.unwrap();
    db.batch_execute(HISTORY).await.unwrap();
    let count = |from: chrono::DateTime<chrono::Utc>, to: chrono::DateTime<chrono::Utc>| {
        let db = &db;
        async move {
            let row = db
                .query_one(
                    "SELECT count(*), count(*) FILTER (WHERE status = 'dead') \
                     FROM workflow_status WHERE finished_at > $1 AND finished_at <= $2",
                    &[&from, &to],
                )
                .await
                .unwrap();
            (row.get::<_, i64>(0), row.get::<_, i64>(1))
        }
    };
    let read = |a: &shardq::client::FinishedSince| {
        a.by_queue
            .iter()
            .fold((0, 0), |(d, f), (_, dq, fq)| (d + dq, f + fq))
    };
    let now = || async {
        let row = db.query_one("SELECT now()", &[]).await.unwrap();
        row.get::<_, chrono::DateTime<chrono::Utc>>(0)
    };
    let since = now().await - chrono::TimeDelta::minutes(61);
    let client = shardq::Client::new(&config).unwrap();
    let (span, deadline) = (Duration::from_secs(30), Duration::from_secs(10));

    let first = client.finished_since(&[Some(since)], span, deadline).await[0]
        .clone()
        .expect("the shard answers");
    assert!(
        now().await - first.at < chrono::TimeDelta::minutes(1),
        "it ends near the shard's now, not an hour back: {first:?}"
    );
    assert_eq!(
        first.at - first.from,
        chrono::TimeDelta::from_std(span).unwrap()
    );
    let skipped = count(since, first.from).await.0;
    assert!(skipped > 50_000, "the gap it did not read: {skipped}");
    assert_eq!(read(&first), count(first.from, first.at).await);

    // Completions just after the first span's end: only the next read's.
    db.execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at) \
         SELECT 0, 'q', 'noop', 'succeeded', 1, $1::timestamptz + interval '1 millisecond' \
         FROM generate_series(1, 500)",
        &[&first.at],
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = client
        .finished_since(&[Some(first.at)], span, deadline)
        .await[0]
        .clone()
        .expect("the shard answers");
    assert_eq!(second.from, first.at, "it goes on where the first ended");
    let (done, failed) = read(&second);
    assert!(done >= 500, "{second:?}");
    assert_eq!((done, failed), count(first.at, second.at).await);
}
