//! `store::jobs::claim`, gated and not.

use super::{claim, complete, info, insert, job, one_shard, params, seconds_until, status, OWNER};
use serde_json::json;
use shardq::config::DequeueMode;
use shardq::job::{Completion, Outcome};
use shardq::store::jobs::{self, Claim, ClaimParams};
use shardq::store::{locks, JobStatus};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_takes_ready_jobs_with_owner_fence_and_attempt() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    assert!(matches!(
        jobs::claim(shard, params("q", 10, OWNER)).await.unwrap(),
        Claim::Empty
    ));
    let ids = insert(
        shard,
        &[job("q", 0), job("q", 1), job("q", 2), job("other", 3)],
    )
    .await;
    let first = claim(shard, "q", 2, OWNER).await;
    assert_eq!(
        first.iter().map(|j| j.id).collect::<Vec<_>>(),
        ids[..2].to_vec()
    );
    for (n, j) in first.iter().enumerate() {
        assert_eq!(j.attempt, 1);
        assert_eq!(j.fence, 1);
        assert_eq!(j.claim, 0);
        assert_eq!(j.shard, 0);
        assert_eq!(j.queue, "q");
        assert_eq!(j.handler, "h");
        assert_eq!(j.payload, json!({ "n": n }));
        let row = info(shard, j.id).await;
        assert_eq!(row.status, JobStatus::Running);
        assert_eq!(row.owner.as_deref(), Some(OWNER));
        assert_eq!(row.attempts, 1);
        assert!(row.started_at.is_some());
        let lease = seconds_until(shard, j.id, "lease_expires_at").await;
        assert!((50.0..=60.0).contains(&lease), "lease ends in {lease} s");
    }
    let rest = claim(shard, "q", 10, "worker-b").await;
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].id, ids[2]);
    assert_eq!(info(shard, ids[2]).await.owner.as_deref(), Some("worker-b"));
    assert!(matches!(
        jobs::claim(shard, params("q", 10, OWNER)).await.unwrap(),
        Claim::Empty
    ));
    assert_eq!(status(shard, ids[3]).await, JobStatus::Queued);

    // Released and claimed again: a new fence, the attempt not counted twice.
    let w = complete(
        shard,
        OWNER,
        &[Completion::of(&first[0], Outcome::Released)],
    )
    .await;
    assert_eq!(w.released, 1);
    let again = claim(shard, "q", 10, OWNER).await;
    assert_eq!(again.len(), 1);
    assert_eq!(
        (again[0].id, again[0].fence, again[0].attempt),
        (ids[0], 2, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_is_busy_while_every_gated_slot_is_held() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let ids = insert(shard, &[job("q", 0), job("q", 1)]).await;
    let gated = |slots| ClaimParams {
        mode: DequeueMode::Gated { slots },
        ..params("q", 1, OWNER)
    };
    let mut holder = shard.user_client().await.unwrap();
    let tx = holder.transaction().await.unwrap();
    for slot in 0..2 {
        tx.execute(
            "SELECT pg_advisory_xact_lock($1::int, $2::int)",
            &[&locks::dequeue_class("q"), &slot],
        )
        .await
        .unwrap();
    }
    assert!(matches!(
        jobs::claim(shard, gated(2)).await.unwrap(),
        Claim::Busy
    ));
    assert!(matches!(
        jobs::claim(shard, gated(1)).await.unwrap(),
        Claim::Busy
    ));
    assert_eq!(status(shard, ids[0]).await, JobStatus::Queued);
    // Slots are per queue: another queue's claim is not held up.
    assert!(matches!(
        jobs::claim(
            shard,
            ClaimParams {
                queue: "other",
                ..gated(2)
            }
        )
        .await
        .unwrap(),
        Claim::Empty
    ));
    // A third slot is free.
    match jobs::claim(shard, gated(3)).await.unwrap() {
        Claim::Jobs(j) => assert_eq!(j[0].id, ids[0]),
        other => panic!("slot 2 was free: {other:?}"),
    }
    tx.rollback().await.unwrap();
    match jobs::claim(shard, gated(2)).await.unwrap() {
        Claim::Jobs(j) => assert_eq!(j[0].id, ids[1]),
        other => panic!("slots freed: {other:?}"),
    }
    assert!(matches!(
        jobs::claim(shard, gated(2)).await.unwrap(),
        Claim::Empty
    ));
}
