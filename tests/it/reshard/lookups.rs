//! Reads and changes of one job while its range moves.

use crate::common;

use super::{growing_to_three, moving_key, statuses, WORKER_TOML};
use common::{wait_until, ShardList, TestShards};
use serde_json::json;
use shardq::reshard::{reshard, Options, Step};
use shardq::shards::ShardSet;
use shardq::{Client, Config, HandlerRegistry, JobStatus, NewJob, OnDuplicate, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Reads and changes of one job while its range moves, from a client
/// routing by the new map: a deduplicated job running on its old shard has
/// a stand-in on the new one (its deduplication id), which is not the job:
/// `job()` shows the running job, `cancel()` reaches it there, `result()`
/// waits for it; a queued job that `result()` waits on is copied to the new
/// shard and removed from the old one meanwhile, and the wait follows it.
/// Before, the stand-in answered the first three (held; no cancel; "not
/// found" at the release) and the moved job was "not found".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_during_a_move_find_the_job_where_it_is() {
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let client = Client::new(&m.new).unwrap();
    let running = |name: &str| {
        let key = moving_key(&m.plan, name);
        NewJob::new("moving", "sleep", json!({ "ms": 3_000 })).dedup(key, OnDuplicate::Error)
    };
    let awaited = client.enqueue(running("awaited")).await.unwrap();
    let cancelled = client.enqueue(running("cancelled")).await.unwrap();
    let queued = client
        .enqueue(
            NewJob::new("later", "noop", json!({})).ordering_key(moving_key(&m.plan, "queued")),
        )
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let old_worker = {
        let (config, stop) = (m.old.clone(), stop.clone());
        tokio::spawn(async move {
            let shards = ShardSet::connect(&config).unwrap();
            Worker::new(config, shards, HandlerRegistry::with_builtins())
                .run(stop)
                .await
        })
    };
    wait_until(
        Duration::from_secs(20),
        "both jobs run on their old shard",
        || async {
            let a = client.job(awaited).await.unwrap().unwrap().status;
            let c = client.job(cancelled).await.unwrap().unwrap().status;
            a == JobStatus::Running && c == JobStatus::Running
        },
    )
    .await;
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &opened, |_| {}).await.unwrap();
    assert_eq!(client.shards().load_map().await.unwrap().epoch(), 2);
    let stand_ins = statuses(m.all.get(2)).await;
    assert_eq!(stand_ins.get("held"), Some(&2), "{stand_ins:?}");

    let info = client.job(awaited).await.unwrap().expect("the job");
    assert_eq!(info.status, JobStatus::Running, "the job, not its stand-in");
    assert_eq!(
        client.cancel(cancelled).await.unwrap(),
        Some(JobStatus::Running),
        "the cancel reaches the running job"
    );
    let asked: bool = m
        .all
        .get(usize::from(cancelled.shard_key >= 32_768))
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT cancel_requested FROM workflow_status WHERE id = $1",
            &[&cancelled.id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        asked,
        "the running row on the old shard was asked to cancel"
    );
    // Both waits find their job on its old shard before the drain begins.
    let waits = {
        let client = client.clone();
        tokio::spawn(async move {
            let timeout = Duration::from_secs(60);
            tokio::join!(
                client.result(awaited, timeout),
                client.result(queued, timeout)
            )
        })
    };

    tokio::time::sleep(Duration::from_millis(300)).await;
    let summary = reshard(&m.all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete && summary.moved >= 1, "{summary:?}");
    stop.cancel();
    old_worker.await.unwrap();
    let later = Config::from_toml(
        &ShardList::numbered(&m.servers.urls)
            .pool_size(12)
            .toml("[worker]\nqueues = [\"later\"]\n"),
    )
    .unwrap();
    Worker::new(later, m.all.clone(), HandlerRegistry::with_builtins())
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    let (awaited_outcome, queued_outcome) = waits.await.unwrap();
    assert!(
        matches!(awaited_outcome, Ok(shardq::JobOutcome::Succeeded(_))),
        "{awaited_outcome:?}"
    );
    assert!(
        matches!(queued_outcome, Ok(shardq::JobOutcome::Succeeded(_))),
        "the wait followed the job to its new shard: {queued_outcome:?}"
    );
}
