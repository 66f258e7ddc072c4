//! `store::backlog::read`, what the metrics exporter runs per scrape: the
//! counts by state, the oldest ready job's age, and a plan that reads only
//! the partial indexes of unfinished jobs however much history there is.

use crate::common;

use common::TestShards;
use serde_json::Value;
use shardq::store::backlog::{self, QueueBacklog};
use shardq::{Client, NewJob};
use std::time::Duration;

fn find<'a>(rows: &'a [QueueBacklog], queue: &str, state: &str) -> Option<&'a QueueBacklog> {
    rows.iter().find(|r| r.queue == queue && r.state == state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_counts_each_state_and_ages_the_first_enqueued_ready_job() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    // The first-enqueued ready jobs are keyed and of a later priority: the
    // head is found across both dequeue indexes and every priority.
    let first: Vec<NewJob> = (0..2)
        .map(|i| {
            NewJob::new("x", "noop", serde_json::json!({}))
                .ordering_key(format!("k{i}"))
                .priority(5)
        })
        .collect();
    client.enqueue_many(first).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let later: Vec<NewJob> = (0..3)
        .map(|_| NewJob::new("x", "noop", serde_json::json!({})))
        .chain([NewJob::new("x", "noop", serde_json::json!({})).delay(Duration::from_secs(600))])
        .chain([NewJob::new("y", "noop", serde_json::json!({}))])
        .collect();
    client.enqueue_many(later).await.unwrap();

    let rows = backlog::read(set.get(0)).await.unwrap();
    let x = find(&rows, "x", "queued").expect("x has ready jobs");
    assert_eq!(x.count, 5);
    let age = x.oldest_ready_s.unwrap();
    assert!(
        (1.1..600.0).contains(&age),
        "the oldest ready job of x waited since the first enqueue: {age} s"
    );
    let y = find(&rows, "y", "queued").unwrap();
    assert_eq!(y.count, 1);
    assert!(y.oldest_ready_s.unwrap() < age);
    assert_eq!(find(&rows, "x", "delayed").unwrap().count, 1);
    assert!(find(&rows, "x", "running").is_none());
    assert!(rows
        .iter()
        .filter(|r| r.state != "queued")
        .all(|r| r.oldest_ready_s.is_none()));
}

/// Finished rows in the table (by `generate_series`, as a long history).
const HISTORY: i64 = 50_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_reads_only_the_partial_indexes_of_unfinished_jobs() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let jobs = (0..200)
        .map(|i| NewJob::new(format!("q{}", i % 3), "noop", serde_json::json!({})))
        .collect();
    client.enqueue_many(jobs).await.unwrap();
    // A connection of shardq's own pool: it carries the planner settings.
    let db = set.get(0).client().await.unwrap();
    db.execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, status, finished_at) \
         SELECT (g % 65536)::int, 'q' || (g % 3), 'noop', 'succeeded', now() \
         FROM generate_series(1, $1::bigint) AS g",
        &[&HISTORY],
    )
    .await
    .unwrap();
    db.batch_execute("VACUUM ANALYZE workflow_status")
        .await
        .unwrap();

    let explain = format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {}",
        shardq::store::sql::QUEUE_BACKLOG
    );
    let plan: Value = db.query_one(explain.as_str(), &[]).await.unwrap().get(0);
    let text = plan.to_string();
    let mut scans = Vec::new();
    table_scans(&plan, &mut scans);
    assert!(!scans.is_empty(), "no read of workflow_status in {text}");
    let unfinished = [
        "workflow_status_dequeue",
        "workflow_status_dequeue_keyed",
        "workflow_status_key",
        "workflow_status_scheduled_queue",
        "workflow_status_lease",
    ];
    let mut rows_read = 0.0;
    for scan in &scans {
        let index = scan["Index Name"]
            .as_str()
            .unwrap_or("no index (a table scan)");
        assert!(
            unfinished.contains(&index),
            "the backlog reads {index}, which holds finished rows: {text}"
        );
        let loops = scan["Actual Loops"].as_f64().unwrap_or(1.0);
        rows_read += scan["Actual Rows"].as_f64().unwrap_or(0.0) * loops;
    }
    assert!(
        rows_read < 1_000.0,
        "{rows_read} rows read for 200 unfinished jobs: {text}"
    );
    let rows = backlog::read(set.get(0)).await.unwrap();
    let ready: i64 = rows
        .iter()
        .filter(|r| r.state == "queued")
        .map(|r| r.count)
        .sum();
    assert_eq!(ready, 200);
}

/// Every plan node that reads `workflow_status`.
fn table_scans<'a>(node: &'a Value, out: &mut Vec<&'a Value>) {
    match node {
        Value::Object(map) => {
            if map.get("Relation Name").and_then(Value::as_str) == Some("workflow_status") {
                out.push(node);
            }
            map.values().for_each(|v| table_scans(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| table_scans(v, out)),
        _ => {}
    }
}
