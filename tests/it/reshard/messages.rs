//! A workflow's messages move with it: copied in their order with the job,
//! removed from the old shard; a send while the job is held (moving) is
//! refused, and after the move a send lands behind the copied messages.

use super::{growing_to_three, moving_key, GrowingToThree, WORKER_TOML};
use crate::common::TestShards;
use serde_json::{json, Value};
use shardq::reshard::{reshard, Options, Step};
use shardq::shards::Shard;
use shardq::{Client, ClientError, HandlerRegistry, JobId, JobStatus, NewJob, Worker};
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
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&all, 2, 3, &opened, |_| {}).await.unwrap();
    let m = plan
        .moves
        .iter()
        .find(|m| m.first_key <= id.shard_key && id.shard_key < m.end_key)
        .unwrap();
    let (from, to) = (all.get(m.from_index), all.get(2));
    shardq::store::reshard::mark_held(from, (id.shard_key, id.shard_key + 1))
        .await
        .unwrap();
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
