//! The examples run against real shards and do what their comments say:
//! `embed` drains its jobs; `workflow` commits its job with the caller's own
//! row, retries after a failure without repeating a recorded step, and ends;
//! `order_saga` ships an order whose shipment message arrives and refunds
//! one whose wait times out.

use crate::common;

use common::TestShards;
use shardq::Shardq;
use std::path::PathBuf;
use std::process::Command;

/// The built example `name` (`cargo test` builds the examples).
pub(crate) fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let path = profile.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo test` (it builds the examples) or `cargo build --examples`",
        path.display()
    );
    path
}

async fn run(name: &str) -> String {
    run_with(name, &[]).await.1
}

/// Runs example `name` with its shards.toml and then `args`; the shards
/// (kept for a look at the database) and what it printed.
async fn run_with(name: &str, args: &[&str]) -> (TestShards, String) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let shards = TestShards::databases(1).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shards.toml");
    std::fs::write(
        &config,
        shards.toml("[worker]\nretry_backoff_min_ms = 100\nretry_backoff_max_ms = 200\n"),
    )
    .unwrap();
    let out = tokio::task::spawn_blocking({
        let exe = example(name);
        move || Command::new(exe).arg(&config).args(&args).output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{name} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (shards, stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedding_example_drains_its_jobs() {
    let out = run("embed").await;
    assert!(out.contains("enqueued 10 jobs"), "{out}");
    assert!(out.contains("done: 10 succeeded"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workflow_example_charges_once_across_a_retry() {
    let out = run("workflow").await;
    assert!(out.contains("committed together"), "{out}");
    assert!(out.contains("attempts: 2, card charged 1 time(s)"), "{out}");
    assert!(out.contains("Succeeded"), "{out}");
}

/// The order saga's rows: how many times each of its steps `charge`,
/// `refund` and its recv's wait (`shardq:recv:1:wait`, written when it
/// parked) was recorded, and its order's final status.
async fn saga_rows(shards: &TestShards) -> (i64, i64, i64, String) {
    let shardq = Shardq::connect(shards.config("")).unwrap();
    let db = shardq.shards().get(0).client().await.unwrap();
    let count = |step: &'static str| {
        let db = &db;
        async move {
            db.query_one(
                "SELECT count(*) FROM workflow_steps WHERE step_name = $1",
                &[&step],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
        }
    };
    let status: String = db
        .query_one(
            "SELECT status::text FROM workflow_status WHERE handler = 'order'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let steps = (
        count("charge").await,
        count("refund").await,
        count("shardq:recv:1:wait").await,
    );
    (steps.0, steps.1, steps.2, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_saga_ships_when_the_shipment_message_arrives() {
    let (shards, out) = run_with("order_saga", &["--shipment-timeout-ms", "30000"]).await;
    assert!(out.contains("sent the shipment message"), "{out}");
    assert!(out.contains("ended: \"shipped\""), "{out}");
    assert_eq!(out.matches("charged the card").count(), 1, "{out}");
    assert!(!out.contains("refunded"), "{out}");
    let (charged, refunded, _, status) = saga_rows(&shards).await;
    assert_eq!((charged, refunded, status.as_str()), (1, 0, "succeeded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_saga_refunds_when_no_shipment_comes_in_time() {
    let (shards, out) = run_with(
        "order_saga",
        &["--shipment-timeout-ms", "1500", "--no-shipment"],
    )
    .await;
    assert!(!out.contains("sent the shipment message"), "{out}");
    assert!(out.contains("ended: \"refunded\""), "{out}");
    assert_eq!(out.matches("charged the card").count(), 1, "{out}");
    assert_eq!(out.matches("refunded receipt-42").count(), 1, "{out}");
    // It parked in its recv until the timeout, then refunded once.
    assert_eq!(saga_rows(&shards).await, (1, 1, 1, "succeeded".into()));
}
