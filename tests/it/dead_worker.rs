//! A worker that stops heartbeating gives its running jobs back within a few
//! heartbeat periods, not at the end of their lease: a `shardq worker`
//! process SIGKILLed in the middle of a batch leased for 60 s sees its jobs
//! run again, by another worker, well before those leases end. And a worker
//! alive but silent (SIGSTOPped) that comes back late with its completions
//! is fenced: its released jobs are not taken for done.

use crate::common;

use common::{wait_until, TestShards};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use shardq::job::{Completion, Outcome};
use shardq::shards::{Shard, ShardSet};
use shardq::store::jobs::{self, CompleteMany};
use shardq::{Client, HandlerRegistry, JobId, NewJob, Worker};
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// Jobs the doomed worker holds when it dies.
const JOBS: usize = 12;

/// A long lease, so that only the release (not lease expiry) can bring
/// the jobs back while the test runs.
const WORKER_TOML: &str = "
[worker]
queues = [\"dw\"]
lease_ms = 60000
maintenance_interval_ms = 200
";

/// A job the doomed worker runs, as its row was when the worker died.
#[derive(Debug, Clone)]
struct Held {
    id: JobId,
    owner: String,
    fence: i64,
    lease_until: SystemTime,
}

async fn held_jobs(shard: &Shard) -> Vec<Held> {
    let db = shard.client().await.unwrap();
    db.query(
        "SELECT shard_key, id, owner, fence, lease_expires_at FROM workflow_status \
         WHERE status = 'running' ORDER BY id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| Held {
        id: JobId {
            shard_key: r.get(0),
            id: r.get(1),
        },
        owner: r.get(2),
        fence: r.get(3),
        lease_until: r.get(4),
    })
    .collect()
}

/// `shardq worker` on `toml`'s shards, running `JOBS` hour-long sleeps.
async fn doomed_worker(
    dbs: &TestShards,
    dir: &std::path::Path,
) -> (tokio::process::Child, Vec<Held>, ShardSet, Client) {
    let toml = dbs.toml(WORKER_TOML);
    let config = shardq::Config::from_toml(&toml).unwrap();
    let set = dbs.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let hour = json!({ "ms": 3_600_000 });
    client
        .enqueue_many(
            (0..JOBS)
                .map(|_| NewJob::new("dw", "sleep", hour.clone()))
                .collect(),
        )
        .await
        .unwrap();
    let path = dir.join("shards.toml");
    std::fs::write(&path, &toml).unwrap();
    let child = shardq_harness::exe::shardq_command(&path)
        .arg("worker")
        .spawn()
        .unwrap();
    let shard = set.get(0).clone();
    wait_until(Duration::from_secs(30), "the worker runs every job", || {
        let shard = shard.clone();
        async move { held_jobs(&shard).await.len() == JOBS }
    })
    .await;
    let held = held_jobs(&shard).await;
    (child, held, set, client)
}

/// The jobs' rows now: (status, attempts, started_at).
async fn rows(shard: &Shard) -> Vec<(String, i32, Option<SystemTime>)> {
    let db = shard.client().await.unwrap();
    db.query(
        "SELECT status, attempts, started_at FROM workflow_status ORDER BY id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_jobs_run_again_long_before_their_lease_ends() {
    let dbs = TestShards::databases(1).await;
    let dir = tempfile::tempdir().unwrap();
    let (mut doomed, held, set, _client) = doomed_worker(&dbs, dir.path()).await;
    kill(Pid::from_raw(doomed.id().unwrap() as i32), Signal::SIGKILL).unwrap();
    doomed.wait().await.unwrap();

    // Another worker, whose sleeps are short.
    let config = dbs.config(WORKER_TOML);
    let mut handlers = HandlerRegistry::with_builtins();
    handlers.register("sleep", |_ctx| async { Ok(json!("rerun")) });
    let stop = CancellationToken::new();
    let survivor = tokio::spawn(
        Worker::new(
            config,
            ShardSet::connect(&dbs.config(WORKER_TOML)).unwrap(),
            handlers,
        )
        .run(stop.clone()),
    );
    let shard = set.get(0).clone();
    wait_until(Duration::from_secs(120), "every job done", || {
        let shard = shard.clone();
        async move { rows(&shard).await.iter().all(|r| r.0 == "succeeded") }
    })
    .await;
    stop.cancel();
    survivor.await.unwrap();

    let rows = rows(&shard).await;
    assert_eq!(rows.len(), JOBS);
    for (held, (_, attempts, started)) in held.iter().zip(&rows) {
        assert_eq!(*attempts, 2, "{held:?}: the killed attempt counts");
        assert!(
            started.unwrap() < held.lease_until,
            "{held:?} ran again only once its lease ended, at {started:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_workers_late_completions_are_fenced() {
    let dbs = TestShards::databases(1).await;
    let dir = tempfile::tempdir().unwrap();
    let (mut silent, held, set, _client) = doomed_worker(&dbs, dir.path()).await;
    let pid = Pid::from_raw(silent.id().unwrap() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();

    // A worker of another queue: it beats and keeps the shard, runs nothing.
    let config = dbs.config(&WORKER_TOML.replace("\"dw\"", "\"other\""));
    let stop = CancellationToken::new();
    let watcher = tokio::spawn(
        Worker::new(
            config.clone(),
            ShardSet::connect(&config).unwrap(),
            HandlerRegistry::with_builtins(),
        )
        .run(stop.clone()),
    );
    let shard = set.get(0).clone();
    wait_until(
        Duration::from_secs(55),
        "the silent worker's jobs given back",
        || {
            let shard = shard.clone();
            async move { rows(&shard).await.iter().all(|r| r.0 == "queued") }
        },
    )
    .await;
    let now: SystemTime = shard
        .client()
        .await
        .unwrap()
        .query_one("SELECT now()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        held.iter().all(|h| now < h.lease_until),
        "given back before the leases ended"
    );

    // The silent worker wakes up and writes what its handlers did.
    let done: Vec<Completion> = held
        .iter()
        .map(|h| Completion {
            id: h.id,
            shard: 0,
            fence: h.fence,
            key: None,
            outcome: Outcome::Succeeded(json!("late")),
            finished: std::time::Instant::now(),
            credited: true,
        })
        .collect();
    let write = CompleteMany {
        owner: &held[0].owner,
        retry: shardq::config::Backoff {
            min: Duration::from_secs(1),
            max: Duration::from_secs(1),
        },
        done: &done,
    };
    let written = jobs::complete_many(&shard, write).await.unwrap();
    assert_eq!(written.fenced, JOBS as u64, "{written:?}");
    assert_eq!(written.total(), 0, "{written:?}");
    assert!(
        rows(&shard)
            .await
            .iter()
            .all(|r| r.0 == "queued" && r.1 == 1),
        "the late completions changed nothing"
    );

    kill(pid, Signal::SIGKILL).unwrap();
    silent.wait().await.unwrap();
    stop.cancel();
    watcher.await.unwrap();
}
