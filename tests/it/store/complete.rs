//! `store::jobs::complete_many`: outcomes, fences and repeats.

use super::{
    claim, complete, exec, info, insert, job, one_shard, seconds_until, status, where_id, OWNER,
};
use serde_json::json;
use shardq::job::{Completion, Outcome};
use shardq::store::jobs::Written;
use shardq::store::{upkeep, JobStatus};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_many_writes_succeeded_retrying_dead_and_released() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let ids = insert(
        shard,
        &[
            job("q", 0),
            job("q", 1),
            job("q", 2).max_attempts(1),
            job("q", 3),
        ],
    )
    .await;
    let claimed = claim(shard, "q", 10, OWNER).await;
    assert_eq!(claimed.len(), 4);
    let done = [
        Completion::of(&claimed[0], Outcome::Succeeded(json!({ "ok": true }))),
        Completion::of(&claimed[1], Outcome::Failed("boom".into())),
        Completion::of(&claimed[2], Outcome::Failed("last".into())),
        Completion::of(&claimed[3], Outcome::Released),
    ];
    let w = complete(shard, OWNER, &done).await;
    assert_eq!(
        w,
        Written {
            succeeded: 1,
            retrying: 1,
            dead: 1,
            cancelled: 0,
            released: 1,
            already: 0,
            fenced: 0,
        }
    );
    assert_eq!(w.total(), 4);

    let ok = info(shard, ids[0]).await;
    assert_eq!(ok.status, JobStatus::Succeeded);
    assert_eq!(ok.output, Some(json!({ "ok": true })));
    assert!(ok.finished_at.is_some() && ok.owner.is_none());

    let retrying = info(shard, ids[1]).await;
    assert_eq!(retrying.status, JobStatus::Scheduled);
    assert_eq!(retrying.error.as_deref(), Some("boom"));
    assert_eq!(retrying.attempts, 1);
    assert!(retrying.finished_at.is_none() && retrying.owner.is_none());
    // First retry: min (60 s) with jitter 0.5..1, stored in run_at.
    let due_in = seconds_until(shard, ids[1], "run_at").await;
    assert!((29.0..=60.5).contains(&due_in), "retry due in {due_in} s");

    let dead = info(shard, ids[2]).await;
    assert_eq!(dead.status, JobStatus::Dead);
    assert_eq!(dead.error.as_deref(), Some("last"));
    assert!(dead.finished_at.is_some());

    let released = info(shard, ids[3]).await;
    assert_eq!(released.status, JobStatus::Queued);
    assert_eq!(released.attempts, 0, "a release is not an attempt");
    assert!(released.started_at.is_none() && released.owner.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_many_fences_out_a_wrong_fence_or_owner_and_counts_a_repeat_as_already() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let ids = insert(shard, &[job("q", 0), job("q", 1)]).await;
    let claimed = claim(shard, "q", 10, OWNER).await;
    let succeed = Completion::of(&claimed[0], Outcome::Succeeded(json!(1)));
    let fail = Completion::of(&claimed[1], Outcome::Failed("again".into()));

    let mut stale = succeed.clone();
    stale.fence += 1;
    let w = complete(shard, OWNER, &[stale]).await;
    assert_eq!((w.total(), w.fenced), (0, 1));
    let w = complete(shard, "worker-b", std::slice::from_ref(&succeed)).await;
    assert_eq!((w.total(), w.fenced), (0, 1));
    assert_eq!(status(shard, ids[0]).await, JobStatus::Running);

    let both = [succeed.clone(), fail.clone()];
    let w = complete(shard, OWNER, &both).await;
    assert_eq!((w.succeeded, w.retrying, w.already, w.fenced), (1, 1, 0, 0));
    // The same write again (its reply lost): nothing rewritten, counted
    // under the outcome the first try wrote.
    let finished_before = info(shard, ids[0]).await.finished_at;
    let w = complete(shard, OWNER, &both).await;
    assert_eq!(
        w,
        Written {
            succeeded: 1,
            retrying: 1,
            already: 2,
            ..Written::default()
        }
    );
    assert_eq!(info(shard, ids[0]).await.finished_at, finished_before);

    // Once the retrying job is claimed again, the old completion is fenced.
    exec(
        shard,
        &format!(
            "UPDATE workflow_status SET run_at = now() - interval '1 s' WHERE {}",
            where_id(ids[1])
        ),
    )
    .await;
    assert_eq!(upkeep::promote_due(shard, 10).await.unwrap(), 1);
    let second = claim(shard, "q", 10, OWNER).await;
    assert_eq!(
        (second[0].id, second[0].fence, second[0].attempt),
        (ids[1], 2, 2)
    );
    let w = complete(shard, OWNER, std::slice::from_ref(&fail)).await;
    assert_eq!((w.total(), w.already, w.fenced), (0, 0, 1));
    assert_eq!(status(shard, ids[1]).await, JobStatus::Running);
}

/// The lost-replies run found this: the leaser gave back as an orphan a job
/// whose success was written while it asked the shard, and the release,
/// finding the row with its claim's fence and no owner, counted as a second
/// success. A repeat counts as already written only when it asks what the
/// row shows; a release after the success, or a success after a release,
/// of the same claim is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_many_counts_as_already_only_a_repeat_that_agrees_with_the_row() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let ids = insert(shard, &[job("q", 0), job("q", 1)]).await;
    let claimed = claim(shard, "q", 10, OWNER).await;

    let succeed = Completion::of(&claimed[0], Outcome::Succeeded(json!("out")));
    assert_eq!(
        complete(shard, OWNER, std::slice::from_ref(&succeed))
            .await
            .succeeded,
        1
    );
    let release = Completion::of(&claimed[0], Outcome::Released);
    let w = complete(shard, OWNER, &[release]).await;
    assert_eq!(
        w,
        Written {
            fenced: 1,
            ..Written::default()
        }
    );
    assert_eq!(status(shard, ids[0]).await, JobStatus::Succeeded);
    // The same success again still counts as already written.
    let w = complete(shard, OWNER, &[succeed]).await;
    assert_eq!((w.succeeded, w.already, w.fenced), (1, 1, 0));

    let release = Completion::of(&claimed[1], Outcome::Released);
    assert_eq!(
        complete(shard, OWNER, std::slice::from_ref(&release))
            .await
            .released,
        1
    );
    let late = Completion::of(&claimed[1], Outcome::Succeeded(json!("late")));
    let w = complete(shard, OWNER, &[late]).await;
    assert_eq!((w.total(), w.already, w.fenced), (0, 0, 1));
    assert_eq!(status(shard, ids[1]).await, JobStatus::Queued);
    let w = complete(shard, OWNER, &[release]).await;
    assert_eq!((w.released, w.already, w.fenced), (1, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_many_of_a_keyed_job_queues_the_next_job_of_its_key() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let ids = insert(
        shard,
        &[job("q", 0).ordering_key("k"), job("q", 1).ordering_key("k")],
    )
    .await;
    let first = claim(shard, "q", 1, OWNER).await;
    assert_eq!(first[0].id, ids[0]);
    assert_eq!(first[0].ordering_key.as_deref(), Some("k"));
    assert_eq!(status(shard, ids[1]).await, JobStatus::Waiting);
    assert!(claim(shard, "q", 10, OWNER).await.is_empty());
    let done = Completion::of(&first[0], Outcome::Succeeded(json!(null)));
    assert!(done.keyed());
    let w = complete(shard, OWNER, &[done]).await;
    assert_eq!(w.succeeded, 1);
    assert_eq!(status(shard, ids[1]).await, JobStatus::Queued);
    let next = claim(shard, "q", 10, OWNER).await;
    assert_eq!(next[0].id, ids[1]);
}
