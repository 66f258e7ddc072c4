//! Pausing a queue: no worker on any shard claims its jobs from the pause
//! on; running jobs finish; enqueueing goes on; other queues are untouched;
//! the pause outlives the workers; resuming wakes idle workers at once.

use crate::common;

use common::{wait_until, TestShards};
use shardq::shards::ShardSet;
use shardq::{Client, ClientError, HandlerRegistry, NewJob, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Jobs of `queue` in `status`, over every shard.
async fn count(shards: &ShardSet, queue: &str, status: &str) -> i64 {
    let mut total = 0;
    for shard in shards.all() {
        let db = shard.client().await.unwrap();
        let row = db
            .query_one(
                "SELECT count(*) FROM workflow_status WHERE queue = $1 AND status = $2",
                &[&queue, &status],
            )
            .await
            .unwrap();
        total += row.get::<_, i64>(0);
    }
    total
}

/// Jobs of `queue` claimed (`started_at`) more than `grace_ms` after the
/// queue was paused on their shard.
async fn claimed_after_pause(shards: &ShardSet, queue: &str, grace_ms: i64) -> i64 {
    let mut total = 0;
    for shard in shards.all() {
        let db = shard.client().await.unwrap();
        let row = db
            .query_one(
                "SELECT count(*) FROM workflow_status w, shardq_paused_queues p \
                 WHERE w.queue = $1 AND p.queue = $1 \
                   AND w.started_at > p.paused_at + $2::bigint * interval '1 millisecond'",
                &[&queue, &grace_ms],
            )
            .await
            .unwrap();
        total += row.get::<_, i64>(0);
    }
    total
}

fn jobs(queue: &str, handler: &str, n: usize) -> Vec<NewJob> {
    (0..n)
        .map(|_| NewJob::new(queue, handler, serde_json::json!({})))
        .collect()
}

fn handlers() -> HandlerRegistry {
    let mut handlers = HandlerRegistry::with_builtins();
    handlers.register("slow", |_ctx| async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(serde_json::Value::Null)
    });
    handlers.register("long", |_ctx| async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Ok(serde_json::json!("finished"))
    });
    handlers
}

/// While a worker drains a queue on 2 shards, the queue is paused: from then
/// on no job of it is claimed on either shard, a job running at the pause
/// finishes, enqueueing still works, and another queue of the same worker
/// keeps draining. Resumed, the queue drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_is_claimed_nowhere_and_resumes() {
    let shards = TestShards::databases(2).await;
    // Small batches and buffer, so the pause meets many claims to refuse.
    let config = shards.config(
        "[dequeue]\nbatch_size = 5\n\n[worker]\nqueues = [\"q\", \"other\"]\n\
         concurrency = 4\nbuffer_jobs = 8\n",
    );
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let long = client
        .enqueue(NewJob::new("q", "long", serde_json::json!({})))
        .await
        .unwrap();
    client.enqueue_many(jobs("q", "slow", 600)).await.unwrap();

    let shutdown = CancellationToken::new();
    let worker = Worker::new(config.clone(), set.clone(), handlers());
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_until(Duration::from_secs(20), "some jobs of q finish", || async {
        count(&set, "q", "succeeded").await >= 20
    })
    .await;
    assert_eq!(count(&set, "q", "running").await.min(1), 1, "q is draining");

    client.pause_queue("q").await.unwrap();
    let paused = client.paused_queues().await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].queue, "q");
    assert_eq!(paused[0].shards.len(), 2, "paused on every shard");

    // Enqueueing goes on; the other queue drains while q is paused.
    client.enqueue_many(jobs("q", "slow", 50)).await.unwrap();
    client
        .enqueue_many(jobs("other", "slow", 100))
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(20),
        "the other queue drains",
        || async { count(&set, "other", "succeeded").await == 100 },
    )
    .await;
    // What was claimed before the pause has finished by now (the long job
    // too); nothing of q is running, and nothing was claimed after it.
    wait_until(
        Duration::from_secs(10),
        "q's claimed jobs finish",
        || async { count(&set, "q", "running").await == 0 },
    )
    .await;
    let outcome = client.result(long, Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        outcome,
        shardq::JobOutcome::Succeeded(serde_json::json!("finished"))
    );
    let left = count(&set, "q", "queued").await;
    assert!(left >= 50, "q's jobs wait: {left} queued");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(count(&set, "q", "queued").await, left, "nothing claimed");
    assert_eq!(claimed_after_pause(&set, "q", 1000).await, 0);

    client.resume_queue("q").await.unwrap();
    assert!(client.paused_queues().await.unwrap().is_empty());
    wait_until(Duration::from_secs(30), "q drains after resume", || async {
        count(&set, "q", "succeeded").await == 651
    })
    .await;
    shutdown.cancel();
    running.await.unwrap();
}

/// The pause lives in the shards: a worker started after it (a restart)
/// claims nothing of the queue; with the fallback poll at a minute, resuming
/// starts the jobs within seconds, so the resume's wake-up reached it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_outlives_workers_and_resume_wakes_them() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("[dequeue]\nidle_poll_ms = 60000\n\n[worker]\nqueues = [\"q\"]\n");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    client.pause_queue("q").await.unwrap();
    client.pause_queue("q").await.unwrap(); // twice: no change, no error
    client.enqueue_many(jobs("q", "noop", 40)).await.unwrap();

    let shutdown = CancellationToken::new();
    let worker = Worker::new(config.clone(), set.clone(), handlers());
    let running = tokio::spawn(worker.run(shutdown.clone()));
    // Every target answered empty and is skipped for 30-60 s from now.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(count(&set, "q", "queued").await, 40, "a paused queue waits");

    client.resume_queue("q").await.unwrap();
    wait_until(Duration::from_secs(15), "q drains after resume", || async {
        count(&set, "q", "succeeded").await == 40
    })
    .await;
    shutdown.cancel();
    running.await.unwrap();
}

/// A pause that cannot reach a shard says which one and pauses the rest;
/// bad names are refused before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_that_misses_a_shard_names_it() {
    let shards = TestShards::databases(1).await;
    let good = shards.config("");
    let set = shards.migrated(&good).await;
    // A second shard on a port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let toml = format!(
        "{}\n[[shards]]\nname = \"gone\"\nurl = \"postgres://postgres@127.0.0.1:{port}/shardq\"\n\
         [dequeue]\nconnect_timeout_ms = 500\n",
        shards.toml("")
    );
    let config = shardq::Config::from_toml(&toml).unwrap();
    let client = Client::new(&config).unwrap();
    let err = client.pause_queue("q").await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, ClientError::NotEveryShard { .. }), "{err:?}");
    assert!(message.contains("gone"), "{message}");
    assert!(message.contains("run it again"), "{message}");
    // The reachable shard is paused.
    let db = set.get(0).client().await.unwrap();
    let n: i64 = db
        .query_one(
            "SELECT count(*) FROM shardq_paused_queues WHERE queue = 'q'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);

    let only = Client::from_shards(set.clone(), good.limits.clone());
    assert!(matches!(
        only.pause_queue("").await,
        Err(ClientError::Invalid { .. })
    ));
}
