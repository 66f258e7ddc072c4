//! `store::upkeep`: lease recovery, promotion of due jobs, retention.

use super::{claim, complete, exec, info, insert, job, one_shard, scalar, status, where_id, OWNER};
use serde_json::json;
use shardq::job::{Completion, Outcome};
use shardq::store::jobs::{self, Written};
use shardq::store::{locks, steps, upkeep, JobStatus};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_expired_requeues_kills_or_cancels_and_skips_when_another_recovers() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let ids = insert(
        shard,
        &[
            job("q", 0),
            job("q", 1).max_attempts(1),
            job("q", 2),
            job("q", 3),
        ],
    )
    .await;
    let claimed = claim(shard, "q", 10, OWNER).await;
    assert_eq!(claimed.len(), 4);
    jobs::cancel(shard, ids[2]).await.unwrap();
    // Nothing expired yet.
    assert_eq!(
        upkeep::recover_expired(shard, 100).await.unwrap(),
        upkeep::Recovered::default()
    );
    let expired = ids[..3]
        .iter()
        .map(|id| format!("({})", where_id(*id)))
        .collect::<Vec<_>>()
        .join(" OR ");
    exec(
        shard,
        &format!(
            "UPDATE workflow_status SET lease_expires_at = now() - interval '1 s' WHERE {expired}"
        ),
    )
    .await;

    // Another process holds the recovery slot: nothing happens.
    let mut other = shard.user_client().await.unwrap();
    let tx = other.transaction().await.unwrap();
    tx.execute(
        "SELECT pg_advisory_xact_lock($1::int, $2::int)",
        &[&locks::maintenance_class(), &locks::RECOVERY_SLOT],
    )
    .await
    .unwrap();
    assert_eq!(
        upkeep::recover_expired(shard, 100).await.unwrap(),
        upkeep::Recovered::default()
    );
    assert_eq!(status(shard, ids[0]).await, JobStatus::Running);
    tx.rollback().await.unwrap();

    let r = upkeep::recover_expired(shard, 100).await.unwrap();
    assert_eq!(
        r,
        upkeep::Recovered {
            requeued: 1,
            dead: 1,
            cancelled: 1
        }
    );
    let back = info(shard, ids[0]).await;
    assert_eq!(back.status, JobStatus::Queued);
    assert_eq!(back.attempts, 1, "the attempt is kept");
    assert!(back.owner.is_none());
    let dead = info(shard, ids[1]).await;
    assert_eq!(dead.status, JobStatus::Dead);
    assert!(
        dead.error
            .as_deref()
            .unwrap_or("")
            .contains("lease expired"),
        "{dead:?}"
    );
    assert!(dead.finished_at.is_some());
    assert_eq!(status(shard, ids[2]).await, JobStatus::Cancelled);
    assert_eq!(status(shard, ids[3]).await, JobStatus::Running);
    // Recovery raised the fence (1 → 2), the new claim raises it again.
    let again = claim(shard, "q", 10, "worker-b").await;
    assert_eq!(
        (again[0].id, again[0].attempt, again[0].fence),
        (ids[0], 2, 3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_after_lease_recovery_is_fenced_not_already() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let ids = insert(shard, &[job("q", 0), job("q", 1).max_attempts(1)]).await;
    let claimed = claim(shard, "q", 10, OWNER).await;
    exec(
        shard,
        "UPDATE workflow_status SET lease_expires_at = now() - interval '1 s'",
    )
    .await;
    let r = upkeep::recover_expired(shard, 100).await.unwrap();
    assert_eq!((r.requeued, r.dead), (1, 1));
    // The old owner's outcomes arrive late: neither was written by this
    // claim's completion, so both are fenced out.
    let late = [
        Completion::of(&claimed[0], Outcome::Succeeded(json!(1))),
        Completion::of(&claimed[1], Outcome::Succeeded(json!(1))),
    ];
    let w = complete(shard, OWNER, &late).await;
    assert_eq!(status(shard, ids[0]).await, JobStatus::Queued);
    assert_eq!(status(shard, ids[1]).await, JobStatus::Dead);
    assert_eq!(
        w,
        Written {
            fenced: 2,
            ..Written::default()
        },
        "late completions after recovery"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_due_queues_due_scheduled_jobs_only() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let hour = Duration::from_secs(3600);
    let ids = insert(shard, &[job("q", 0).delay(hour), job("q", 1).delay(hour)]).await;
    assert_eq!(upkeep::promote_due(shard, 10).await.unwrap(), 0);
    exec(
        shard,
        &format!(
            "UPDATE workflow_status SET run_at = now() - interval '1 s' WHERE {}",
            where_id(ids[0])
        ),
    )
    .await;
    // Another process holds the promotion slot: skipped.
    let mut other = shard.user_client().await.unwrap();
    let tx = other.transaction().await.unwrap();
    tx.execute(
        "SELECT pg_advisory_xact_lock($1::int, $2::int)",
        &[&locks::maintenance_class(), &locks::PROMOTION_SLOT],
    )
    .await
    .unwrap();
    assert_eq!(upkeep::promote_due(shard, 10).await.unwrap(), 0);
    tx.rollback().await.unwrap();

    assert_eq!(upkeep::promote_due(shard, 10).await.unwrap(), 1);
    assert_eq!(status(shard, ids[0]).await, JobStatus::Queued);
    assert_eq!(status(shard, ids[1]).await, JobStatus::Scheduled);
    assert_eq!(upkeep::promote_due(shard, 10).await.unwrap(), 0);
    assert_eq!(claim(shard, "q", 10, OWNER).await[0].id, ids[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_finished_deletes_old_finished_jobs_with_their_steps() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let ids = insert(shard, &[job("q", 0), job("q", 1), job("q", 2)]).await;
    let claimed = claim(shard, "q", 2, OWNER).await;
    for c in &claimed {
        let recorded = steps::record(
            shard,
            steps::RecordStep {
                id: c.id,
                name: "s",
                output: &json!(1),
                owner: OWNER,
                fence: c.fence,
            },
        )
        .await
        .unwrap();
        assert!(recorded);
    }
    let done: Vec<Completion> = claimed
        .iter()
        .map(|c| Completion::of(c, Outcome::Succeeded(json!(1))))
        .collect();
    complete(shard, OWNER, &done).await;
    let (old, young, unfinished) = (ids[0], ids[1], ids[2]);
    exec(
        shard,
        &format!(
            "UPDATE workflow_status SET finished_at = now() - interval '1 hour' WHERE {}",
            where_id(old)
        ),
    )
    .await;
    let ten_min = Duration::from_secs(600);
    assert_eq!(
        upkeep::delete_finished(shard, ten_min, 100).await.unwrap(),
        1
    );
    assert!(!jobs::exists(shard, old).await.unwrap());
    assert_eq!(steps::get(shard, old, "s").await.unwrap(), None);
    let orphan_steps: i64 = scalar(
        shard,
        &format!(
            "SELECT count(*) FROM workflow_steps WHERE shard_key = {} AND workflow_id = {}",
            old.shard_key, old.id
        ),
    )
    .await;
    assert_eq!(orphan_steps, 0);
    assert!(jobs::exists(shard, young).await.unwrap());
    assert_eq!(
        steps::get(shard, young, "s").await.unwrap(),
        Some(Some(json!(1)))
    );
    assert!(jobs::exists(shard, unfinished).await.unwrap());
    assert_eq!(
        upkeep::delete_finished(shard, ten_min, 100).await.unwrap(),
        0
    );
    // Age zero: the young finished job goes, the queued one stays.
    assert_eq!(
        upkeep::delete_finished(shard, Duration::ZERO, 100)
            .await
            .unwrap(),
        1
    );
    assert!(!jobs::exists(shard, young).await.unwrap());
    assert!(jobs::exists(shard, unfinished).await.unwrap());
}
