//! `store::queues`: pending work and counts.

use super::{claim, complete, insert, job, one_shard, status, OWNER};
use serde_json::json;
use shardq::job::{Completion, Outcome};
use shardq::store::jobs;
use shardq::store::{queues, JobStatus};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn has_pending_sees_queued_running_and_retrying_jobs_only() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    assert!(!queues::has_pending(shard, "q").await.unwrap());
    // A finished job and a delayed first attempt are not pending.
    insert(shard, &[job("q", 0)]).await;
    let c = claim(shard, "q", 10, OWNER).await;
    complete(
        shard,
        OWNER,
        &[Completion::of(&c[0], Outcome::Succeeded(json!(1)))],
    )
    .await;
    insert(shard, &[job("q", 1).delay(Duration::from_secs(3600))]).await;
    assert!(!queues::has_pending(shard, "q").await.unwrap());

    let queued = insert(shard, &[job("q", 2)]).await[0];
    assert!(queues::has_pending(shard, "q").await.unwrap());
    assert!(!queues::has_pending(shard, "other").await.unwrap());
    let running = claim(shard, "q", 10, OWNER).await;
    assert_eq!(running[0].id, queued);
    assert!(queues::has_pending(shard, "q").await.unwrap());
    complete(
        shard,
        OWNER,
        &[Completion::of(&running[0], Outcome::Failed("x".into()))],
    )
    .await;
    assert_eq!(status(shard, queued).await, JobStatus::Scheduled);
    assert!(queues::has_pending(shard, "q").await.unwrap(), "retrying");
    jobs::cancel(shard, queued).await.unwrap();
    assert!(!queues::has_pending(shard, "q").await.unwrap());

    // Keyed: queued and waiting ones count too.
    insert(
        shard,
        &[job("q", 3).ordering_key("k"), job("q", 4).ordering_key("k")],
    )
    .await;
    assert!(queues::has_pending(shard, "q").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_by_queue_and_state_and_connections() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    insert(
        shard,
        &[
            job("a", 0).max_attempts(1),
            job("a", 1),
            job("a", 2),
            job("a", 3).ordering_key("k"),
            job("a", 4).ordering_key("k"),
        ],
    )
    .await;
    let c = claim(shard, "a", 3, OWNER).await;
    // a0 dead, a1 retrying, a2 running; a3 and a4 are both queued keyed jobs.
    complete(
        shard,
        OWNER,
        &[
            Completion::of(&c[0], Outcome::Failed("x".into())),
            Completion::of(&c[1], Outcome::Failed("x".into())),
        ],
    )
    .await;
    insert(
        shard,
        &[
            job("b", 0).delay(Duration::from_secs(3600)),
            job("b", 1),
            job("b", 2),
        ],
    )
    .await;
    let b = claim(shard, "b", 1, OWNER).await;
    complete(
        shard,
        OWNER,
        &[Completion::of(&b[0], Outcome::Succeeded(json!(1)))],
    )
    .await;

    let read = queues::counts(shard).await.unwrap();
    assert!(!read.bounded);
    let mut got: Vec<(String, String, i64, bool)> = read
        .counts
        .into_iter()
        .map(|c| (c.queue, c.status, c.count, c.estimated))
        .collect();
    got.sort();
    let want = |q: &str, s: &str, n| (q.to_string(), s.to_string(), n, false);
    assert_eq!(
        got,
        vec![
            want("a", "dead", 1),
            want("a", "queued", 2),
            want("a", "retrying", 1),
            want("a", "running", 1),
            want("b", "delayed", 1),
            want("b", "queued", 1),
            want("b", "succeeded", 1),
        ]
    );

    let _held = shard.user_client().await.unwrap();
    let conns = queues::connections(shard).await.unwrap();
    assert!(conns.shardq >= 1, "{conns:?}");
    assert!(conns.user >= 1, "{conns:?}");
    assert!(conns.total >= conns.shardq + conns.user, "{conns:?}");
    assert!(conns.max > 0, "{conns:?}");
}
