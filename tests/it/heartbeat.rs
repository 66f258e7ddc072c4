//! Worker heartbeats (`shardq_workers`): a running worker has one row per
//! shard whose counters follow its work; a worker that stops deletes its
//! rows; a row whose worker died silently is deleted by another worker's
//! heartbeat once it is older than the TTL.

use crate::common;

use common::{wait_until, TestShards};
use shardq::store::workers;
use shardq::worker::HEARTBEAT_TTL;
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const FAST: &str = "
[dequeue]
empty_backoff_min_ms = 5
empty_backoff_max_ms = 10
[worker]
queues = [\"hb\"]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_beats_on_every_shard_and_stale_rows_expire() {
    let dbs = TestShards::databases(2).await;
    let config = dbs.config(FAST);
    let set = dbs.migrated(&config).await;
    // A worker that died without a word, a minute past the TTL.
    let ghost = set.get(0).client().await.unwrap();
    ghost
        .execute(
            "INSERT INTO shardq_workers (worker_id, host, pid, queues, started_at, heartbeat_at) \
             VALUES ('ghost', 'gone', 1, '{hb}', now() - interval '1 hour', now() - $1 * interval '1 second')",
            &[&(HEARTBEAT_TTL.as_secs_f64() + 60.0)],
        )
        .await
        .unwrap();
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let jobs = (0..60)
        .map(|_| NewJob::new("hb", "noop", serde_json::json!({})))
        .collect();
    client.enqueue_many(jobs).await.unwrap();

    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(
            config.clone(),
            set.clone(),
            HandlerRegistry::with_builtins(),
        )
        .run(stop.clone()),
    );
    let live = |set: shardq::shards::ShardSet| async move {
        let mut rows = Vec::new();
        for shard in set.all() {
            rows.push(
                workers::live(shard, Duration::from_secs(3600))
                    .await
                    .unwrap(),
            );
        }
        rows
    };
    wait_until(
        Duration::from_secs(30),
        "a later heartbeat brings the counters",
        || {
            let set = set.clone();
            async move {
                let rows = live(set).await;
                let completed: u64 = rows.iter().flatten().map(|w| w.counters.completed).sum();
                rows.iter().all(|r| r.len() == 1) && completed == 60
            }
        },
    )
    .await;
    for rows in live(set.clone()).await {
        let w = &rows[0];
        assert_eq!(w.pid as u32, std::process::id());
        assert_eq!(w.queues, vec!["hb".to_string()]);
        assert_ne!(w.worker_id, "ghost", "the stale row was deleted");
        assert!(w.counters.claims >= 1 && w.counters.claimed >= 1, "{w:?}");
        assert!(
            w.counters.claim_us > 0,
            "the claims' time is reported: {w:?}"
        );
    }
    stop.cancel();
    worker.await.unwrap();
    for rows in live(set.clone()).await {
        assert!(
            rows.is_empty(),
            "a stopped worker deleted its rows: {rows:?}"
        );
    }
}
