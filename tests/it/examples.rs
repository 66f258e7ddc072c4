//! The examples run against real shards and do what their comments say:
//! `embed` drains its jobs; `workflow` commits its job with the caller's own
//! row, retries after a failure without repeating a recorded step, and ends.

use crate::common;

use common::TestShards;
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
        move || Command::new(exe).arg(&config).output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{name} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
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
