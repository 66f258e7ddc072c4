//! `store::jobs` on one job by id: reads (`get`, `outcome`, `exists`) and
//! an operator's changes (`cancel`, `retry`).

use super::{claim, complete, expect_err, info, insert, job, one_shard, status, OWNER};
use serde_json::json;
use shardq::job::{Completion, Outcome};
use shardq::store::jobs::{self, NewRow};
use shardq::store::{ErrorKind, JobStatus};
use shardq::JobId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_outcome_and_exists_read_one_job() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let unknown = JobId {
        shard_key: 7,
        id: 424_242,
    };
    assert!(jobs::get(shard, unknown).await.unwrap().is_none());
    assert!(jobs::outcome(shard, unknown).await.unwrap().is_none());
    assert!(!jobs::exists(shard, unknown).await.unwrap());

    let ids = insert(shard, &[job("q", 0), job("q", 1).max_attempts(1)]).await;
    assert!(jobs::exists(shard, ids[0]).await.unwrap());
    // The same id under another shard key is another job.
    let wrong_key = JobId {
        shard_key: ids[0].shard_key + 100,
        id: ids[0].id,
    };
    assert!(!jobs::exists(shard, wrong_key).await.unwrap());
    assert_eq!(
        jobs::outcome(shard, ids[0]).await.unwrap(),
        Some(jobs::JobOutcomeRow {
            status: JobStatus::Queued,
            output: None,
            error: None,
        })
    );
    let j = info(shard, ids[0]).await;
    assert_eq!(j.id, ids[0].to_string());
    assert!(j.created_at.is_some() && j.run_at.is_some());
    assert!(j.started_at.is_none() && j.finished_at.is_none() && j.owner.is_none());
    assert!(!j.cancel_requested && j.dedup_id.is_none());

    let claimed = claim(shard, "q", 10, OWNER).await;
    complete(
        shard,
        OWNER,
        &[
            Completion::of(&claimed[0], Outcome::Succeeded(json!({ "r": [1, 2] }))),
            Completion::of(&claimed[1], Outcome::Failed("nope".into())),
        ],
    )
    .await;
    assert_eq!(
        jobs::outcome(shard, ids[0]).await.unwrap(),
        Some(jobs::JobOutcomeRow {
            status: JobStatus::Succeeded,
            output: Some(json!({ "r": [1, 2] })),
            error: None,
        })
    );
    assert_eq!(
        jobs::outcome(shard, ids[1]).await.unwrap(),
        Some(jobs::JobOutcomeRow {
            status: JobStatus::Dead,
            output: None,
            error: Some("nope".into()),
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_unstarted_jobs_and_asks_running_ones() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let ids = insert(shard, &[job("q", 0), job("q", 1), job("q", 2)]).await;
    let claimed = claim(shard, "q", 2, OWNER).await;
    let (running, buffered, queued) = (ids[0], ids[1], ids[2]);

    assert_eq!(jobs::cancel_requested(shard, &ids).await.unwrap(), vec![]);
    assert_eq!(
        jobs::cancel(shard, queued).await.unwrap(),
        Some(JobStatus::Cancelled)
    );
    let q = info(shard, queued).await;
    assert_eq!(q.status, JobStatus::Cancelled);
    assert!(q.finished_at.is_some());
    assert!(!q.cancel_requested);

    for id in [running, buffered] {
        assert_eq!(
            jobs::cancel(shard, id).await.unwrap(),
            Some(JobStatus::Running)
        );
        let r = info(shard, id).await;
        assert_eq!(r.status, JobStatus::Running);
        assert!(r.cancel_requested && r.finished_at.is_none());
    }
    let mut asked = jobs::cancel_requested(shard, &ids).await.unwrap();
    asked.sort_by_key(|j| j.id);
    assert_eq!(asked, vec![running, buffered]);
    // Finished or unknown: nothing to cancel.
    assert_eq!(jobs::cancel(shard, queued).await.unwrap(), None);
    let unknown = JobId {
        shard_key: 1,
        id: 999_999,
    };
    assert_eq!(jobs::cancel(shard, unknown).await.unwrap(), None);

    // The worker's outcomes then land as cancelled.
    let w = complete(
        shard,
        OWNER,
        &[
            Completion::of(&claimed[0], Outcome::Failed("stopped".into())),
            Completion::of(&claimed[1], Outcome::Released),
        ],
    )
    .await;
    assert_eq!((w.cancelled, w.released, w.retrying), (2, 0, 0));
    assert_eq!(status(shard, running).await, JobStatus::Cancelled);
    let b = info(shard, buffered).await;
    assert_eq!(b.status, JobStatus::Cancelled);
    assert_eq!(b.error.as_deref(), Some("cancelled before it started"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_requeues_a_dead_job_and_reports_a_taken_dedup_id() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let j = job("q", 0).max_attempts(1);
    let row = |shard_key| NewRow {
        shard_key,
        job: &j,
        max_attempts: 1,
    };
    let plain = insert(shard, &[job("q", 1).max_attempts(1)]).await[0];
    let deduped = jobs::insert_dedup(shard, row(2), "d")
        .await
        .unwrap()
        .unwrap();
    let claimed = claim(shard, "q", 10, OWNER).await;
    let failures: Vec<Completion> = claimed
        .iter()
        .map(|c| Completion::of(c, Outcome::Failed("x".into())))
        .collect();
    assert_eq!(complete(shard, OWNER, &failures).await.dead, 2);

    assert!(jobs::retry(shard, plain).await.unwrap());
    let again = info(shard, plain).await;
    assert_eq!(again.status, JobStatus::Queued);
    assert_eq!(again.attempts, 0);
    assert!(again.finished_at.is_none());
    // Not finished: nothing to retry.
    assert!(!jobs::retry(shard, plain).await.unwrap());
    let unknown = JobId {
        shard_key: 1,
        id: 999_999,
    };
    assert!(!jobs::retry(shard, unknown).await.unwrap());

    // Its dedup id taken by a new unfinished job: the retry is refused.
    let taker = jobs::insert_dedup(shard, row(3), "d")
        .await
        .unwrap()
        .unwrap();
    let err = expect_err(jobs::retry(shard, deduped).await, "retry over a taken id");
    assert_eq!(err.kind(), ErrorKind::UniqueViolation, "{err:?}");
    assert!(err.is_permanent());
    assert_eq!(status(shard, deduped).await, JobStatus::Dead);
    assert_eq!(
        jobs::find_dedup(shard, "q", "d").await.unwrap(),
        Some(taker)
    );
}
