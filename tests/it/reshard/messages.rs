//! A workflow's messages move with it: copied in their order with the job,
//! removed from the old shard; a send while the job is held (moving) is
//! refused, and after the move a send lands behind the copied messages. A
//! workflow's `ctx.send` to a job being moved parks and lands after the move.

use super::{growing_to_three, moving_key, GrowingToThree, WORKER_TOML};
use crate::common::TestShards;
use serde_json::{json, Value};
use shardq::reshard::{reshard, Options, Step};
use shardq::shards::{Shard, ShardSet};
use shardq::{Client, ClientError, HandlerRegistry, JobId, JobOutcome, JobStatus, NewJob, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The workflow's messages on `shard`: (topic, message), in `seq` order.
async fn messages_on(shard: &Shard, id: JobId) -> Vec<(String, Value)> {
    shard
        .client()
        .await
        .unwrap()
        .query(
            "SELECT topic, message FROM workflow_messages \
             WHERE shard_key = $1 AND workflow_id = $2 ORDER BY seq",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Opens the move 2 → 3 of `plan` (its first step only) and marks job
/// `id`, whose key moves to the new shard, held on the shard it leaves, as
/// the copy does: (that shard, the new one).
async fn held_by_the_move<'a>(
    all: &'a ShardSet,
    plan: &shardq::reshard::Plan,
    id: JobId,
) -> (&'a Shard, &'a Shard) {
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(all, 2, 3, &opened, |_| {}).await.unwrap();
    let m = plan
        .moves
        .iter()
        .find(|m| m.first_key <= id.shard_key && id.shard_key < m.end_key)
        .unwrap();
    let (from, to) = (all.get(m.from_index), all.get(2));
    shardq::store::reshard::mark_held(from, (id.shard_key, id.shard_key + 1))
        .await
        .unwrap();
    (from, to)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflows_messages_move_with_it_in_order() {
    let GrowingToThree {
        servers: _servers,
        new,
        all,
        plan,
        ..
    } = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let client = Client::new(&new).unwrap();
    let key = moving_key(&plan, "mail");
    let id = client
        .enqueue(NewJob::new("moving", "inbox", json!({})).ordering_key(key))
        .await
        .unwrap();
    client.send(id, "t", json!(1), Some("k1")).await.unwrap();
    client.send(id, "other", json!("x"), None).await.unwrap();
    client.send(id, "t", json!(2), None).await.unwrap();
    let (from, to) = held_by_the_move(&all, &plan, id).await;
    let refused = client.send(id, "t", json!("lost?"), None).await;
    assert!(
        matches!(
            refused,
            Err(ClientError::SendRefused {
                status: Some(JobStatus::Held),
                ..
            })
        ),
        "{refused:?}"
    );

    let summary = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    let moved = vec![
        ("t".to_string(), json!(1)),
        ("other".to_string(), json!("x")),
        ("t".to_string(), json!(2)),
    ];
    assert_eq!(messages_on(to, id).await, moved, "copied, in order");
    assert!(
        messages_on(from, id).await.is_empty(),
        "removed at the source"
    );

    // After the move: the key still dedupes, a new message comes last.
    client.send(id, "t", json!(1), Some("k1")).await.unwrap();
    client.send(id, "t", json!(3), None).await.unwrap();
    let mut handlers = HandlerRegistry::new();
    handlers.register("inbox", |ctx| async move {
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(ctx.recv("t", std::time::Duration::from_secs(30)).await?);
        }
        Ok(json!(got))
    });
    Worker::new(new.clone(), all.clone(), handlers)
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    let info = client.job(id).await.unwrap().expect("the job");
    assert_eq!(info.status, JobStatus::Succeeded);
    assert_eq!(info.output, Some(json!([1, 2, 3])));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflows_send_to_a_job_being_moved_parks_and_lands_after_the_move() {
    let GrowingToThree {
        servers: _servers,
        new,
        all,
        plan,
        ..
    } = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let client = Client::new(&new).unwrap();
    // The recipient in a queue no worker serves; the sender on a key that
    // stays where it is, with one attempt: a failed send would end it.
    let to = client
        .enqueue(NewJob::new("idle", "inbox", json!({})).ordering_key(moving_key(&plan, "mail")))
        .await
        .unwrap();
    let staying = (0..)
        .map(|i| format!("sender-{i}"))
        .find(|k| {
            let at = shardq::router::shard_key_for(k);
            !plan
                .moves
                .iter()
                .any(|m| m.first_key <= at && at < m.end_key)
        })
        .unwrap();
    let sender = client
        .enqueue(
            NewJob::new("moving", "sender", json!({}))
                .ordering_key(staying)
                .max_attempts(1),
        )
        .await
        .unwrap();
    let (from, dest) = held_by_the_move(&all, &plan, to).await;

    let mut handlers = HandlerRegistry::new();
    handlers.register("sender", move |ctx| async move {
        ctx.send(to, "t", json!("from a workflow")).await?;
        Ok(json!("sent"))
    });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(Worker::new(new.clone(), all.clone(), handlers).run(stop.clone()));
    let home = all.for_key(sender.shard_key);
    crate::children_across_outage::parked_due_soon(home, sender, "the sender").await;

    let summary = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    let outcome = client
        .result(sender, Duration::from_secs(60))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(json!("sent")));
    let landed = vec![("t".to_string(), json!("from a workflow"))];
    assert_eq!(messages_on(dest, to).await, landed, "once, after the move");
    assert!(messages_on(from, to).await.is_empty());
}
