//! Cancellation sticks: a job cancelled while it waits in a worker's buffer
//! never starts, whether the worker goes on or is stopped with SIGTERM. Before,
//! the release put it back to `queued` and another worker ran it, and a
//! worker that kept it ran it to `succeeded`.

use crate::common;

use common::{count_status, wait_until, TestShards};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use shardq::shards::ShardSet;
use shardq::{Client, HandlerRegistry, JobId, NewJob, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// One executor slot, so the second job waits in the buffer behind the first.
const WORKER_TOML: &str = "
[dequeue]
batch_size = 10
[worker]
queues = [\"c\"]
concurrency = 1
producers = 1
shutdown_grace_ms = 10000
";

/// Enqueues a slow job then a quick one, and waits until one worker holds both.
async fn slow_then_buffered(client: &Client, set: &ShardSet) -> (JobId, JobId) {
    let slow = NewJob::new("c", "sleep", serde_json::json!({ "ms": 2500 }));
    let quick = NewJob::new("c", "sleep", serde_json::json!({ "ms": 1 }));
    let ids = client.enqueue_many(vec![slow, quick]).await.unwrap();
    wait_until(Duration::from_secs(20), "both jobs claimed", || async {
        count_status(set, "running").await == 2
    })
    .await;
    (ids[0], ids[1])
}

async fn assert_cancelled_unstarted(client: &Client, id: JobId) {
    let job = client.job(id).await.unwrap().unwrap();
    assert_eq!(job.status, "cancelled", "the cancelled job ran: {job:?}");
    assert_eq!(job.error.as_deref(), Some("cancelled before it started"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffered_job_cancelled_while_the_worker_runs_never_starts() {
    let shards = TestShards::databases(1).await;
    let config = shards.config(WORKER_TOML);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(config, set.clone(), HandlerRegistry::with_builtins()).run(stop.clone()),
    );
    let (slow, buffered) = slow_then_buffered(&client, &set).await;
    assert_eq!(
        client.cancel(buffered).await.unwrap().map(|s| s.as_str()),
        Some("running")
    );
    wait_until(Duration::from_secs(20), "both jobs finished", || async {
        count_status(&set, "running").await == 0
    })
    .await;
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(client.job(slow).await.unwrap().unwrap().status, "succeeded");
    assert_cancelled_unstarted(&client, buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_cancel_sigterm_leaves_the_job_cancelled() {
    let shards = TestShards::databases(1).await;
    let config = shards.config(WORKER_TOML);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml(WORKER_TOML)).unwrap();
    let worker = shardq_harness::exe::shardq_command(&path)
        .arg("worker")
        .spawn()
        .unwrap();
    let (_, buffered) = slow_then_buffered(&client, &set).await;
    assert_eq!(
        client.cancel(buffered).await.unwrap().map(|s| s.as_str()),
        Some("running")
    );
    kill(Pid::from_raw(worker.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), worker.wait_with_output())
        .await
        .expect("the worker exits")
        .unwrap()
        .status;
    assert!(status.success());
    assert_cancelled_unstarted(&client, buffered).await;
}
