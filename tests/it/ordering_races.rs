//! The interleavings that broke per-key ordering, cancellation and fencing,
//! each driven step by step against a real PostgreSQL: claims by distinct
//! owners stand for distinct workers, and two open transactions stand for two
//! producers committing out of id order. Each test failed on the code before
//! migration 0004 (per-key exclusion, now in migrations/functions/).

use crate::common;

use common::TestShards;
use serde_json::json;
use shardq::config::{Backoff, DequeueMode};
use shardq::job::{ClaimedJob, Completion, Outcome};
use shardq::shards::{Shard, ShardSet};
use shardq::store::jobs::{self, Claim, ClaimParams, Written};
use shardq::{Client, ClientError, JobId, NewJob};
use std::time::Duration;

struct Setup {
    _shards: TestShards,
    set: ShardSet,
    client: Client,
}

async fn setup() -> Setup {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    Setup {
        _shards: shards,
        set,
        client,
    }
}

impl Setup {
    fn shard(&self) -> &Shard {
        self.set.get(0)
    }

    /// One claim of up to `limit` jobs of queue `q` by worker `owner`.
    async fn claim(&self, owner: &str, limit: u32) -> Vec<ClaimedJob> {
        let params = ClaimParams {
            queue: "q",
            limit,
            owner,
            lease: Duration::from_secs(60),
            mode: DequeueMode::Gated { slots: 2 },
        };
        match jobs::claim(self.shard(), params).await.unwrap() {
            Claim::Jobs(jobs) => jobs,
            Claim::Empty => Vec::new(),
            Claim::HeldBack(jobs) => jobs,
            Claim::Busy => panic!("no other claimer holds a slot"),
        }
    }

    /// Writes `outcome` for each of `jobs`, as worker `owner`.
    async fn finish(&self, owner: &str, jobs: &[ClaimedJob], outcome: Outcome) -> Written {
        let done: Vec<Completion> = jobs
            .iter()
            .map(|j| Completion::of(j, outcome.clone()))
            .collect();
        let backoff = Backoff {
            min: Duration::from_secs(3600),
            max: Duration::from_secs(3600),
        };
        let write = jobs::CompleteMany {
            owner,
            retry: backoff,
            done: &done,
        };
        jobs::complete_many(self.shard(), write).await.unwrap()
    }

    async fn status(&self, id: JobId) -> String {
        self.client
            .job(id)
            .await
            .unwrap()
            .unwrap()
            .status
            .to_string()
    }

    async fn enqueue(&self, job: NewJob) -> JobId {
        self.client.enqueue(job).await.unwrap()
    }
}

fn keyed(key: &str) -> NewJob {
    NewJob::new("q", "noop", json!({})).ordering_key(key)
}

fn ids(jobs: &[ClaimedJob]) -> Vec<JobId> {
    jobs.iter().map(|j| j.id).collect()
}

/// Two producers enqueue jobs of one key in open transactions and commit out
/// of id order: the later id is claimed first. The earlier job, committed
/// while the later one runs, must wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_id_committed_late_waits_for_the_running_job_of_its_key() {
    let s = setup().await;
    let early = s.client.route(keyed("K")).unwrap();
    let late = s.client.route(keyed("K")).unwrap();
    let mut first = early.shard().client().await.unwrap();
    let mut second = late.shard().client().await.unwrap();
    let first_tx = first.transaction().await.unwrap();
    let second_tx = second.transaction().await.unwrap();
    let early_id = early.insert(&*first_tx).await.unwrap();
    let late_id = late.insert(&*second_tx).await.unwrap();
    assert!(early_id.id < late_id.id);
    second_tx.commit().await.unwrap();

    let running = s.claim("w1", 10).await;
    assert_eq!(ids(&running), vec![late_id]);
    first_tx.commit().await.unwrap();

    assert!(
        s.claim("w2", 10).await.is_empty(),
        "the earlier job started while the later job of its key was running"
    );
    assert_eq!(s.status(early_id).await, "waiting");

    s.finish("w1", &running, Outcome::Succeeded(json!(1))).await;
    assert_eq!(ids(&s.claim("w2", 10).await), vec![early_id]);
}

/// `job retry` of an old dead job of a key while a newer job of the key runs:
/// the retried job waits for the running one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_old_job_waits_for_the_running_job_of_its_key() {
    let s = setup().await;
    let old = s.enqueue(keyed("K").max_attempts(1)).await;
    let first = s.claim("w1", 10).await;
    let written = s.finish("w1", &first, Outcome::Failed("boom".into())).await;
    assert_eq!(written.dead, 1);
    let new = s.enqueue(keyed("K")).await;
    let running = s.claim("w2", 10).await;
    assert_eq!(ids(&running), vec![new]);

    assert!(s.client.retry(old).await.unwrap());
    assert!(
        s.claim("w3", 10).await.is_empty(),
        "the retried job started while a job of its key was running"
    );
    s.finish("w2", &running, Outcome::Succeeded(json!(1))).await;
    assert_eq!(ids(&s.claim("w3", 10).await), vec![old]);
}

/// A keyed job fails with attempts left in the middle of a claimed run: the
/// rest of the run goes back unstarted, and no claim takes any job of the key
/// until the failed job has run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrying_job_holds_back_the_rest_of_its_key() {
    let s = setup().await;
    let mut queued = Vec::new();
    for _ in 0..3 {
        queued.push(s.enqueue(keyed("K")).await);
    }
    let run = s.claim("w1", 10).await;
    assert_eq!(ids(&run), queued, "one claim takes the key's jobs as a run");
    let written = s
        .finish("w1", &run[..1], Outcome::Failed("boom".into()))
        .await;
    assert_eq!(written.retrying, 1);
    let written = s.finish("w1", &run[1..], Outcome::Released).await;
    assert_eq!(written.released, 2);
    assert_eq!(s.status(queued[1]).await, "waiting");
    assert!(
        s.claim("w2", 10).await.is_empty(),
        "later jobs of the key overtook its retry"
    );

    // The retry comes due: the key runs again from the failed job, in order.
    s.shard()
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET run_at = now() WHERE id = $1",
            &[&queued[0].id],
        )
        .await
        .unwrap();
    shardq::store::upkeep::promote_due(s.shard(), 100)
        .await
        .unwrap();
    assert_eq!(ids(&s.claim("w2", 10).await), queued);
}

/// A key held by a running job, 1,000 queued jobs of that key, then unkeyed
/// jobs: the first claim takes unkeyed jobs, and parks the key's jobs so no
/// claim locks them again until the key is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_keyed_jobs_never_stand_in_front_of_runnable_ones() {
    let s = setup().await;
    s.enqueue(keyed("K")).await;
    let holder = s.claim("w1", 1).await;
    assert_eq!(holder.len(), 1);
    s.client
        .enqueue_many((0..1000).map(|_| keyed("K")).collect())
        .await
        .unwrap();
    s.client
        .enqueue_many(
            (0..200)
                .map(|_| NewJob::new("q", "noop", json!({})))
                .collect(),
        )
        .await
        .unwrap();

    let got = s.claim("w2", 100).await;
    assert_eq!(
        got.len(),
        100,
        "unkeyed jobs behind a blocked key were not claimed"
    );
    assert!(got.iter().all(|j| j.ordering_key.is_none()));
    let parked = common::count_status(&s.set, "waiting").await;
    assert!(
        parked >= 100,
        "blocked jobs left in the dequeue index: {parked} parked"
    );
    let got = s.claim("w2", 100).await;
    assert_eq!(got.len(), 100);
    assert!(got.iter().all(|j| j.ordering_key.is_none()));

    // Releasing the key queues its next job; a claim then takes the key's run.
    s.finish("w1", &holder, Outcome::Succeeded(json!(1))).await;
    let run = s.claim("w3", 1000).await;
    assert_eq!(run.len(), 1000);
    assert!(run.windows(2).all(|p| p[0].id.id < p[1].id.id));
    assert!(s.claim("w4", 10).await.is_empty());
}

/// Ordering is per (queue, key): a job of key K in a queue no worker serves
/// does not hold back K in another queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_another_queue_does_not_block() {
    let s = setup().await;
    s.enqueue(NewJob::new("elsewhere", "noop", json!({})).ordering_key("K"))
        .await;
    let here = s.enqueue(keyed("K")).await;
    assert_eq!(ids(&s.claim("w1", 10).await), vec![here]);
}

/// Claim, then cancel, then the worker stops before starting the job: the
/// release writes it as cancelled, and no other worker runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cancelled_while_buffered_is_never_released_to_run() {
    let s = setup().await;
    let id = s.enqueue(NewJob::new("q", "noop", json!({}))).await;
    let claimed = s.claim("w1", 10).await;
    assert_eq!(
        s.client.cancel(id).await.unwrap().map(|s| s.as_str()),
        Some("running")
    );
    let written = s.finish("w1", &claimed, Outcome::Released).await;
    assert_eq!(written.cancelled, 1);
    assert_eq!(s.status(id).await, "cancelled");
    assert!(s.claim("w2", 10).await.is_empty());
}

/// Cancelling a keyed job that waits for its retry releases the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_retrying_job_releases_its_key() {
    let s = setup().await;
    let first = s.enqueue(keyed("K")).await;
    let second = s.enqueue(keyed("K")).await;
    let run = s.claim("w1", 1).await;
    s.finish("w1", &run, Outcome::Failed("boom".into())).await;
    assert!(s.claim("w2", 10).await.is_empty());
    assert_eq!(
        s.client.cancel(first).await.unwrap().map(|s| s.as_str()),
        Some("cancelled")
    );
    assert_eq!(ids(&s.claim("w2", 10).await), vec![second]);
}

/// The same worker claims a job, loses it (lease expired, recovered, dead),
/// an operator retries it, and the same worker claims it again: the first
/// claim's late completion must not land on the second. With the attempt
/// count as the fence (reset by the retry), it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_completion_is_fenced_out_after_recovery_and_retry() {
    let s = setup().await;
    let id = s
        .enqueue(NewJob::new("q", "noop", json!({})).max_attempts(1))
        .await;
    let stale = s.claim("w1", 10).await;
    s.shard()
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET lease_expires_at = now() - interval '1 s'",
            &[],
        )
        .await
        .unwrap();
    let recovered = shardq::store::upkeep::recover_expired(s.shard(), 100)
        .await
        .unwrap();
    assert_eq!(recovered.dead, 1);
    assert!(s.client.retry(id).await.unwrap());
    let fresh = s.claim("w1", 10).await;
    assert_eq!(
        fresh[0].attempt, stale[0].attempt,
        "same owner, same attempt number"
    );

    let written = s
        .finish("w1", &stale, Outcome::Failed("stale".into()))
        .await;
    assert_eq!(written.fenced, 1, "the stale completion landed");
    assert_eq!(s.status(id).await, "running");
    let written = s.finish("w1", &fresh, Outcome::Succeeded(json!(2))).await;
    assert_eq!(written.succeeded, 1);
}

/// A deduplication id with an ordering key is refused (the key chooses the
/// shard, so the id could not be checked fleet-wide), and retrying a job
/// whose id is taken again says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_ids_stay_global_and_retry_says_when_one_is_taken() {
    let s = setup().await;
    let both = keyed("K").dedup("d1", shardq::OnDuplicate::Error);
    match s.client.enqueue(both).await {
        Err(ClientError::Invalid { reason, .. }) => {
            assert_eq!(reason, shardq::InvalidJob::KeyAndDedup);
            assert!(
                reason
                    .to_string()
                    .contains("ordering key and a deduplication id"),
                "{reason}"
            )
        }
        other => panic!("expected a clear refusal, got {other:?}"),
    }
    let dedup = || NewJob::new("q", "noop", json!({})).dedup("d2", shardq::OnDuplicate::Error);
    let old = s.enqueue(dedup().max_attempts(1)).await;
    let claimed = s.claim("w1", 10).await;
    s.finish("w1", &claimed, Outcome::Failed("boom".into()))
        .await;
    s.enqueue(dedup()).await;
    let err = s.client.retry(old).await.unwrap_err();
    assert!(matches!(err, ClientError::RetryDuplicate(id) if id == old));
    assert!(err.to_string().contains("same deduplication id"), "{err}");
}

/// A stale attempt records a step while the recovery of its job is being
/// committed: the step record reads the fence under a row lock, so it waits
/// for the recovery and then refuses; the recovered job's next claim records
/// the step itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_step_record_waits_for_the_recovery_and_is_refused() {
    let s = setup().await;
    let id = s.enqueue(NewJob::new("q", "noop", json!({}))).await;
    let stale = s.claim("w1", 10).await;
    let record = |owner: &'static str, fence: i64| {
        let shard = s.shard().clone();
        async move {
            let db = shard.client().await.unwrap();
            db.query_one(
                shardq::store::sql::STEP_RECORD,
                &[
                    &id.shard_key,
                    &id.id,
                    &"step",
                    &json!(owner),
                    &owner,
                    &fence,
                ],
            )
            .await
            .unwrap()
            .get::<_, bool>("recorded")
        }
    };
    let mut recovery = s.shard().client().await.unwrap();
    let recovery = recovery.transaction().await.unwrap();
    recovery
        .execute(
            "UPDATE workflow_status SET lease_expires_at = now() - interval '1 s'",
            &[],
        )
        .await
        .unwrap();
    let recovered = recovery
        .execute(
            shardq::store::sql::JOB_RECOVER_EXPIRED,
            &[&vec![id.shard_key], &vec![id.id]],
        )
        .await
        .unwrap();
    assert_eq!(recovered, 1);

    let step = tokio::spawn(record("w1", stale[0].fence));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !step.is_finished(),
        "the step record did not wait for the recovery"
    );
    recovery.commit().await.unwrap();
    assert!(
        !step.await.unwrap(),
        "a stale attempt recorded a step after losing its job"
    );

    let fresh = s.claim("w2", 10).await;
    assert!(record("w2", fresh[0].fence).await);
}

/// A completion whose reply was lost (a deadline passed after the server
/// wrote it) is written again by the completer: the second try finds the row
/// finished under its own fence and counts it as already written, not as
/// fenced out; another claim's fence still fences it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_completion_counts_as_already_written() {
    let s = setup().await;
    s.enqueue(NewJob::new("q", "noop", json!({}))).await;
    let claimed = s.claim("w1", 10).await;
    let first = s.finish("w1", &claimed, Outcome::Succeeded(json!(1))).await;
    assert_eq!((first.succeeded, first.already, first.fenced), (1, 0, 0));
    let again = s.finish("w1", &claimed, Outcome::Succeeded(json!(1))).await;
    assert_eq!((again.succeeded, again.already, again.fenced), (1, 1, 0));
}
