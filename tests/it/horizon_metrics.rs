//! What holds a shard's xmin horizon, as the exporter scrapes it and
//! `shardq status --shards` shows it: a REPEATABLE READ transaction left
//! open on one shard while a worker runs jobs there, two shards as two
//! databases of one server (so the other shard sees the same sessions in
//! `pg_stat_activity` and must not count them).

use crate::common;

use common::{count_status, wait_until, TestShards};
use shardq::client::CheckOptions;
use shardq::{Client, NewJob};
use std::time::Duration;
use tokio_postgres::IsolationLevel;

const JOBS: usize = 200;
/// Held this long between two scrapes, the age must have grown by most of it.
const HELD_BETWEEN_SCRAPES: Duration = Duration::from_millis(1500);
/// Whatever shardq's own statements (the scrape's check among them) hold
/// is gone in far less.
const BRIEF_S: f64 = 1.0;

/// The value of the series `name{labels}` in an exposition, if present.
fn gauge(text: &str, name: &str, labels: &str) -> Option<f64> {
    let series = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map(|v| v.parse().expect("a number"))
}

fn backend_age(text: &str, shard: &str) -> f64 {
    let labels = format!("shard=\"{shard}\",holder=\"backend\"");
    gauge(text, "shardq_oldest_xmin_age_seconds", &labels)
        .unwrap_or_else(|| panic!("no backend age for {shard} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_snapshot_shows_as_an_old_horizon_and_dead_rows_on_its_shard_only() {
    let shards = TestShards::databases(2).await;
    let extra = "[worker]\nqueues = [\"h\"]\n";
    let config = shards.config(extra);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let queues = vec!["h".to_string()];
    let check = CheckOptions {
        deadline: Duration::from_secs(5),
        ..CheckOptions::from_config(&config)
    };
    let scrape = || shardq::prometheus::backlog::scrape_with_check(&client, &queues, &check);

    // Before: nothing holds either shard's horizon.
    let text = scrape().await;
    assert!(backend_age(&text, "s0") < BRIEF_S, "{text}");
    assert!(
        text.contains("shardq_xmin_horizon_up{shard=\"s0\"} 1\n"),
        "{text}"
    );

    // A report on s0: a snapshot taken, then left open.
    let mut report = set.all()[0].user_client().await.unwrap();
    let tx = report
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .start()
        .await
        .unwrap();
    let row = tx
        .query_one(
            "SELECT pg_backend_pid(), (SELECT count(*) FROM workflow_status)",
            &[],
        )
        .await
        .unwrap();
    let report_pid: i32 = row.get(0);

    // Jobs run meanwhile: each claim and completion leaves a dead version
    // that the open snapshot keeps vacuum from removing.
    let jobs: Vec<NewJob> = (0..JOBS)
        .map(|i| NewJob::new("h", "noop", serde_json::json!({ "i": i })))
        .collect();
    client.enqueue_many(jobs).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml(extra)).unwrap();
    let mut worker = shardq_harness::exe::shardq_command(&path)
        .arg("worker")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(60), "every job succeeded", || async {
        count_status(&set, "succeeded").await == JOBS as i64
    })
    .await;
    // Its sessions end: each reports its statistics as it exits.
    worker.kill().await.unwrap();

    let first = scrape().await;
    tokio::time::sleep(HELD_BETWEEN_SCRAPES).await;
    let text = scrape().await;
    let (before, now) = (backend_age(&first, "s0"), backend_age(&text, "s0"));
    assert!(
        before > 0.0,
        "the held snapshot's age shows on s0:\n{first}"
    );
    assert!(
        now - before >= HELD_BETWEEN_SCRAPES.as_secs_f64() * 0.8,
        "its age grows with the wait: {before} s, then {now} s"
    );
    assert!(
        backend_age(&text, "s1") < BRIEF_S,
        "s1, another database of the same server, is not held:\n{text}"
    );
    let xids = gauge(
        &text,
        "shardq_xmin_horizon_age_xids",
        "shard=\"s0\",holder=\"backend\"",
    );
    assert!(
        xids.unwrap_or(0.0) > 0.0,
        "the jobs' transactions ran since the snapshot's xmin:\n{text}"
    );
    for holder in ["standby", "replication_slot", "prepared"] {
        let labels = format!("shard=\"s0\",holder=\"{holder}\"");
        let held = gauge(&text, "shardq_xmin_horizon_age_xids", &labels);
        assert_eq!(held, Some(0.0), "{holder} holds nothing:\n{text}");
    }

    // The dead versions, once the statistics collector has them.
    let dead_labels = "shard=\"s0\",table=\"workflow_status\"";
    wait_until(
        Duration::from_secs(30),
        "dead row versions reported on s0",
        || async {
            let text = scrape().await;
            gauge(&text, "shardq_queue_table_dead_rows", dead_labels).unwrap_or(0.0) > 0.0
        },
    )
    .await;

    // `shardq status --shards` names the session that holds it.
    let (ok, out) = shardq_harness::exe::shardq_output(&path, &["status", "--shards"]).await;
    assert!(ok, "{out}");
    let held_line = out
        .lines()
        .find(|l| l.contains("xmin horizon: a transaction has held"))
        .unwrap_or_else(|| panic!("no horizon line in:\n{out}"));
    assert!(
        held_line.contains(&format!("(session pid {report_pid})")),
        "{held_line}"
    );
    assert!(held_line.contains("dead row versions"), "{held_line}");

    // The report ends: the age drops on s0.
    tx.commit().await.unwrap();
    let text = scrape().await;
    let after = backend_age(&text, "s0");
    assert!(
        after < BRIEF_S,
        "nothing holds s0 after the report ended: {after} s (was {now} s)"
    );
}
