//! Graceful shutdown: SIGTERM a worker process holding a full buffer. It exits
//! within the grace period with status 0; every buffered job is claimable again
//! at once; none is lost or run twice. A SIGTERM while it is still starting
//! stops it cleanly too.

use crate::common;

use common::{count_status, wait_until, TestShards};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use shardq::{Client, NewJob};
use std::time::{Duration, Instant};

const JOBS: usize = 2_000;

const WORKER_TOML: &str = "
[dequeue]
batch_size = 100
[worker]
queues = [\"s\"]
concurrency = 4
producers = 2
buffer_jobs = 400
shutdown_grace_ms = 5000
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_the_buffer_and_loses_nothing() {
    let shards = TestShards::databases(2).await;
    let config = shards.config(WORKER_TOML);
    let set = shards.migrated(&config).await;
    let jobs = (0..JOBS)
        .map(|_| NewJob::new("s", "sleep", serde_json::json!({ "ms": 300 })))
        .collect();
    Client::from_shards(set.clone(), config.limits.clone())
        .enqueue_many(jobs)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml(WORKER_TOML)).unwrap();

    let mut worker = shardq_harness::exe::shardq_command(&path)
        .arg("worker")
        .spawn()
        .unwrap();
    let probe = set.clone();
    wait_until(Duration::from_secs(30), "the buffer is full", || {
        let set = probe.clone();
        async move { count_status(&set, "running").await >= 300 }
    })
    .await;

    let asked = Instant::now();
    kill(Pid::from_raw(worker.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(15), worker.wait())
        .await
        .expect("the worker exits")
        .unwrap();
    let took = asked.elapsed();
    assert!(status.success(), "exit status {status:?}");
    assert!(
        took < Duration::from_secs(6),
        "exit took {took:?}, grace is 5 s"
    );

    // Immediately claimable: nothing is left running or owned.
    assert_eq!(count_status(&set, "running").await, 0);
    let queued = count_status(&set, "queued").await;
    let succeeded = count_status(&set, "succeeded").await;
    assert_eq!(queued + succeeded, JOBS as i64, "no job lost");
    assert!(
        queued >= 300,
        "the buffered jobs were released, {queued} queued"
    );
    for shard in set.all() {
        let row = shard
            .client()
            .await
            .unwrap()
            .query_one(
                "SELECT count(*) FROM workflow_status WHERE status = 'queued' \
                 AND (owner IS NOT NULL OR attempts <> 0)",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(
            row.get::<_, i64>(0),
            0,
            "released jobs carry no owner or attempt"
        );
    }

    // A new worker drains the rest; every job ran exactly once.
    let fast = WORKER_TOML.replace("concurrency = 4", "concurrency = 64");
    std::fs::write(&path, shards.toml(&fast)).unwrap();
    let out = shardq_harness::exe::shardq_command(&path)
        .args(["worker", "--until-empty"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    assert_eq!(count_status(&set, "succeeded").await, JOBS as i64);
    for shard in set.all() {
        let row = shard
            .client()
            .await
            .unwrap()
            .query_one(
                "SELECT count(*) FROM workflow_status WHERE attempts <> 1",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), 0, "every job ran exactly once");
    }
}

/// A SIGTERM that arrives while the worker is still starting (its schema
/// check waits on a shard that accepts connections and never answers) stops
/// it cleanly: status 0, not killed by the signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_the_start_check_exits_cleanly() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(
        &path,
        format!(
            "[[shards]]\nname = \"silent\"\nurl = \"postgres://shardq@127.0.0.1:{port}/shardq\"\n\
             [dequeue]\nconnect_timeout_ms = 60000\n[worker]\nqueues = [\"s\"]\n"
        ),
    )
    .unwrap();
    let mut worker = shardq_harness::exe::shardq_command(&path)
        .arg("worker")
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    kill(Pid::from_raw(worker.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), worker.wait())
        .await
        .expect("the worker exits")
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    held.abort();
}
