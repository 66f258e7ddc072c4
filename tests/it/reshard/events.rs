//! A workflow's events move with it: a workflow that set an event and
//! parked is copied with its event to the shard its key moves to, the old
//! shard keeps none, and the client reads the event there.

use super::{growing_to_three, moving_key, GrowingToThree, WORKER_TOML};
use crate::common::{self, TestShards};
use serde_json::{json, Value};
use shardq::reshard::{reshard, Options};
use shardq::shards::Shard;
use shardq::{Client, HandlerRegistry, JobId, JobStatus, NewJob, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The workflow's events on `shard`: (key, value).
async fn events_on(shard: &Shard, id: JobId) -> Vec<(String, Value)> {
    shard
        .client()
        .await
        .unwrap()
        .query(
            "SELECT key, value FROM workflow_events \
             WHERE shard_key = $1 AND workflow_id = $2 ORDER BY key",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflows_events_move_with_it() {
    let GrowingToThree {
        servers: _servers,
        new,
        all,
        plan,
        ..
    } = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let client = Client::new(&new).unwrap();
    let key = moving_key(&plan, "event");
    let id = client
        .enqueue(NewJob::new("moving", "publish", json!({})).ordering_key(key))
        .await
        .unwrap();
    let mut handlers = HandlerRegistry::new();
    handlers.register("publish", |ctx| async move {
        ctx.set_event("stage", json!("parked")).await?;
        ctx.set_event("other", json!({"n": 2})).await?;
        ctx.recv("never", Duration::from_secs(3600)).await?;
        Ok(Value::Null)
    });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(Worker::new(new.clone(), all.clone(), handlers).run(stop.clone()));
    common::wait_until(Duration::from_secs(30), "the workflow parks", || async {
        client.job(id).await.unwrap().expect("the job").status == JobStatus::Scheduled
    })
    .await;
    stop.cancel();
    worker.await.unwrap();
    let m = plan
        .moves
        .iter()
        .find(|m| m.first_key <= id.shard_key && id.shard_key < m.end_key)
        .unwrap();
    let (from, to) = (all.get(m.from_index), all.get(2));
    let set = vec![
        ("other".to_string(), json!({"n": 2})),
        ("stage".to_string(), json!("parked")),
    ];
    assert_eq!(events_on(from, id).await, set, "set before the move");

    let summary = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    assert_eq!(events_on(to, id).await, set, "copied");
    assert!(
        events_on(from, id).await.is_empty(),
        "removed at the source"
    );
    let moved = Client::new(&new).unwrap();
    assert_eq!(
        moved.get_event(id, "stage", Duration::ZERO).await.unwrap(),
        Some(json!("parked")),
        "read where the workflow lives now"
    );
}
