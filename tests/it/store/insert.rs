//! `store::jobs`: inserts (`insert_many`, `insert_in`, `insert_dedup`, `find_dedup`).

use super::{claim, info, insert, job, one_shard, seconds_until, status, OWNER};
use serde_json::json;
use shardq::store::jobs::{self, NewRow};
use shardq::store::JobStatus;
use shardq::JobId;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_many_returns_ids_in_input_order_and_delays_start_scheduled() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let input = [
        job("q", 0).priority(5).ordering_key("k"),
        job("q", 1).delay(Duration::from_secs(3600)),
        job("q", 2).max_attempts(7),
    ];
    let ids = insert(shard, &input).await;
    assert_eq!(ids.len(), 3);
    assert!(ids[0].id < ids[1].id && ids[1].id < ids[2].id, "{ids:?}");
    for (n, id) in ids.iter().enumerate() {
        assert_eq!(id.shard_key, n as i32 + 1);
        let j = info(shard, *id).await;
        assert_eq!(j.payload, json!({ "n": n }), "id {id} is not input row {n}");
        assert_eq!(j.queue, "q");
        assert_eq!(j.handler, "h");
        assert_eq!(j.attempts, 0);
    }
    let first = info(shard, ids[0]).await;
    assert_eq!(first.status, JobStatus::Queued);
    assert_eq!(first.priority, 5);
    assert_eq!(first.ordering_key.as_deref(), Some("k"));
    assert_eq!(first.max_attempts, 3);
    assert_eq!(status(shard, ids[1]).await, JobStatus::Scheduled);
    let due_in = seconds_until(shard, ids[1], "run_at").await;
    assert!((3500.0..=3600.0).contains(&due_in), "run_at in {due_in} s");
    assert_eq!(status(shard, ids[2]).await, JobStatus::Queued);
    assert_eq!(info(shard, ids[2]).await.max_attempts, 7);
    // The delayed one is not claimable.
    let claimed = claim(shard, "q", 10, OWNER).await;
    let claimed: Vec<JobId> = claimed.iter().map(|j| j.id).collect();
    assert_eq!(claimed, vec![ids[0], ids[2]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_in_exists_only_when_the_callers_transaction_commits() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let j = job("q", 1);
    let row = NewRow {
        shard_key: 9,
        job: &j,
        max_attempts: 4,
    };
    let mut client = shard.user_client().await.unwrap();

    let tx = client.transaction().await.unwrap();
    let rolled_back = jobs::insert_in(&*tx, row, None).await.unwrap();
    assert_eq!(rolled_back.shard_key, 9);
    tx.rollback().await.unwrap();
    assert!(!jobs::exists(shard, rolled_back).await.unwrap());

    let tx = client.transaction().await.unwrap();
    let committed = jobs::insert_in(&*tx, row, None).await.unwrap();
    // Not visible to shardq's connections before the commit.
    assert!(!jobs::exists(shard, committed).await.unwrap());
    tx.commit().await.unwrap();
    assert!(jobs::exists(shard, committed).await.unwrap());
    let j = info(shard, committed).await;
    assert_eq!(j.status, JobStatus::Queued);
    assert_eq!(j.max_attempts, 4);
    assert_eq!(j.payload, json!({ "n": 1 }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_dedup_refuses_a_second_unfinished_job_and_find_dedup_finds_the_first() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let j = job("q", 1);
    let row = |shard_key| NewRow {
        shard_key,
        job: &j,
        max_attempts: 3,
    };
    assert_eq!(jobs::find_dedup(shard, "q", "d1").await.unwrap(), None);
    let first = jobs::insert_dedup(shard, row(1), "d1")
        .await
        .unwrap()
        .expect("first insert");
    assert_eq!(info(shard, first).await.dedup_id.as_deref(), Some("d1"));
    assert_eq!(jobs::insert_dedup(shard, row(2), "d1").await.unwrap(), None);
    assert_eq!(
        jobs::find_dedup(shard, "q", "d1").await.unwrap(),
        Some(first)
    );
    assert_eq!(jobs::find_dedup(shard, "q", "d2").await.unwrap(), None);
    // Another queue has its own ids.
    let other_queue = job("r", 1);
    let other = NewRow {
        shard_key: 3,
        job: &other_queue,
        max_attempts: 3,
    };
    assert!(jobs::insert_dedup(shard, other, "d1")
        .await
        .unwrap()
        .is_some());
    // A delayed dedup job starts scheduled and still holds its id.
    let delayed = job("q", 2).delay(Duration::from_secs(3600));
    let delayed_row = NewRow {
        shard_key: 4,
        job: &delayed,
        max_attempts: 3,
    };
    let d = jobs::insert_dedup(shard, delayed_row, "d3")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status(shard, d).await, JobStatus::Scheduled);
    assert_eq!(jobs::find_dedup(shard, "q", "d3").await.unwrap(), Some(d));
    // Once the first is finished its id is free again.
    assert_eq!(
        jobs::cancel(shard, first).await.unwrap(),
        Some(JobStatus::Cancelled)
    );
    assert_eq!(jobs::find_dedup(shard, "q", "d1").await.unwrap(), None);
    let second = jobs::insert_dedup(shard, row(5), "d1")
        .await
        .unwrap()
        .expect("id free after the first finished");
    assert_ne!(second, first);
    assert_eq!(
        jobs::find_dedup(shard, "q", "d1").await.unwrap(),
        Some(second)
    );
}
