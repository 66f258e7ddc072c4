//! A debounced job's pending run moves with its key: copied before the
//! range lets enqueues in (with its key and latest start), so an enqueue
//! on the new shard joins the copy, and after the move the key still has
//! one pending run.

use super::{growing_to_three, moving_key, GrowingToThree, WORKER_TOML};
use crate::common::TestShards;
use serde_json::{json, Value};
use shardq::reshard::{reshard, Options, Step};
use shardq::shards::Shard;
use shardq::{Client, NewJob};
use std::time::Duration;

/// The rows of debounce key `key` on `shard`: (id, status, payload,
/// whether `debounce_until` is set).
async fn runs_on(shard: &Shard, key: &str) -> Vec<(i64, String, Value, bool)> {
    shard
        .client()
        .await
        .unwrap()
        .query(
            "SELECT id, status, payload, debounce_until IS NOT NULL FROM workflow_status \
             WHERE debounce_key = $1 ORDER BY id",
            &[&key],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

fn debounced(key: &str, payload: &str) -> NewJob {
    NewJob::new("moving", "sync", json!(payload)).debounce(
        key,
        Duration::from_secs(3600),
        Duration::from_secs(7200),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_run_moves_before_enqueues_of_its_range_are_let_in() {
    let GrowingToThree {
        servers: _servers,
        old,
        new,
        all,
        plan,
    } = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let key = moving_key(&plan, "debounced");
    let before = Client::new(&old)
        .unwrap()
        .enqueue(debounced(&key, "before"))
        .await
        .unwrap();
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&all, 2, 3, &opened, |_| {}).await.unwrap();
    let from = all.get(
        plan.moves
            .iter()
            .find(|m| m.first_key <= before.shard_key && before.shard_key < m.end_key)
            .unwrap()
            .from_index,
    );
    let to = all.get(2);
    assert!(
        runs_on(from, &key).await.is_empty(),
        "moved off the old shard"
    );
    assert_eq!(
        runs_on(to, &key).await,
        vec![(before.id, "held".into(), json!("before"), true)],
        "copied, key and latest start kept, before the range opened"
    );

    let client = Client::new(&new).unwrap();
    let during = client.enqueue(debounced(&key, "during")).await.unwrap();
    assert_eq!(
        during, before,
        "an enqueue while the range moves joins the copy"
    );

    let summary = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    assert_eq!(
        runs_on(to, &key).await,
        vec![(before.id, "scheduled".into(), json!("during"), true)],
        "one pending run after the move"
    );
    let after = client.enqueue(debounced(&key, "after")).await.unwrap();
    assert_eq!(after, before, "and the key's enqueues still join it");
    assert_eq!(runs_on(to, &key).await[0].2, json!("after"));
}
