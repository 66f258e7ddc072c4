//! Deadlines (`NewJob::timeout`): a workflow past its deadline ends
//! `cancelled` with an error that says so, whatever it was doing: queued
//! with no worker for its queue, parked in a long sleep (at the deadline,
//! not the wake), running (its handler learns it at its next step); a
//! child takes the earlier of its own and its parent's deadline, and a
//! parent ended by its deadline takes its children with it, not an
//! abandoned one; a keyed job ended by its deadline frees its key; and a
//! deadline racing a completion ends one way, in both orders.

use crate::common;

use common::TestShards;
use serde_json::json;
use shardq::config::{Backoff, DequeueMode};
use shardq::job::{Completion, Outcome};
use shardq::store::deadlines;
use shardq::store::jobs::{self, Claim, ClaimParams, CompleteMany, NewRow};
use shardq::{ChildPolicy, HandlerRegistry, JobId, JobStatus, NewJob, Shardq, StepError};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "timed";
/// A queue no worker of these tests serves: its jobs stay unstarted.
const IDLE: &str = "unserved";
/// How late past its deadline a workflow may end: the promoter's pass
/// interval (at most 1 s) plus a margin for a loaded test machine.
const LATE: f64 = 2.0;

/// A migrated shard whose worker serves [`QUEUE`] only, one job at a time.
async fn shardq() -> (TestShards, Shardq) {
    let shards = TestShards::databases(1).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nconcurrency = 2\n\
         retry_backoff_min_ms = 10\nretry_backoff_max_ms = 20\n"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    (shards, shardq)
}

fn start_worker(shardq: &Shardq, handlers: HandlerRegistry) -> CancellationToken {
    let stop = CancellationToken::new();
    tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    stop
}

async fn status(shardq: &Shardq, id: JobId) -> JobStatus {
    shardq
        .client()
        .job(id)
        .await
        .unwrap()
        .expect("the job")
        .status
}

/// Waits until job `id` has `want` status.
async fn wait_for(shardq: &Shardq, id: JobId, want: JobStatus, within: Duration) {
    common::wait_until(within, &format!("job {id} {want:?}"), || async {
        status(shardq, id).await == want
    })
    .await;
}

/// Seconds from job `id`'s deadline to when it finished, by the shard's
/// clock, and its error.
async fn ended_after_deadline(shardq: &Shardq, id: JobId) -> (f64, String) {
    let row = shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT extract(epoch FROM finished_at - deadline_at)::float8 AS late, error \
             FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap();
    (
        row.get("late"),
        row.get::<_, Option<String>>("error").unwrap_or_default(),
    )
}

/// The job's deadline, seconds from its creation (NULL: none).
async fn deadline_after_creation(shardq: &Shardq, id: JobId) -> Option<f64> {
    shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT extract(epoch FROM deadline_at - created_at)::float8 FROM workflow_status \
             WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap()
        .get(0)
}

fn assert_ended_by_deadline(late: f64, error: &str) {
    assert!(
        (0.0..LATE).contains(&late),
        "ended {late:.3} s after its deadline"
    );
    assert!(error.starts_with("deadline passed at "), "error: {error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_no_worker_serves_ends_cancelled_at_its_deadline() {
    let (_shards, shardq) = shardq().await;
    let stop = start_worker(&shardq, HandlerRegistry::new());
    let id = shardq
        .client()
        .enqueue(NewJob::new(IDLE, "h", json!({})).timeout(Duration::from_secs(1)))
        .await
        .unwrap();
    let info = shardq.client().job(id).await.unwrap().unwrap();
    assert!(info.deadline_at.is_some(), "job show carries the deadline");
    assert_eq!(deadline_after_creation(&shardq, id).await, Some(1.0));
    wait_for(&shardq, id, JobStatus::Cancelled, Duration::from_secs(10)).await;
    let (late, error) = ended_after_deadline(&shardq, id).await;
    assert_ended_by_deadline(late, &error);
    assert_eq!(
        shardq
            .client()
            .result(id, Duration::from_secs(1))
            .await
            .unwrap(),
        shardq::JobOutcome::Cancelled
    );
    // A job without a timeout has no deadline and stays.
    let plain = shardq
        .client()
        .enqueue(NewJob::new(IDLE, "h", json!({})))
        .await
        .unwrap();
    assert_eq!(deadline_after_creation(&shardq, plain).await, None);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(status(&shardq, plain).await, JobStatus::Queued);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_parked_in_a_long_sleep_ends_at_its_deadline_not_its_wake() {
    let (_shards, shardq) = shardq().await;
    let mut handlers = HandlerRegistry::new();
    handlers.register("nap", |ctx| async move {
        ctx.sleep(Duration::from_secs(3600)).await?;
        Ok(json!("woke"))
    });
    let stop = start_worker(&shardq, handlers);
    let id = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, "nap", json!({})).timeout(Duration::from_secs(3)))
        .await
        .unwrap();
    wait_for(&shardq, id, JobStatus::Scheduled, Duration::from_secs(10)).await;
    let parked = shardq.client().job(id).await.unwrap().unwrap();
    assert!(parked
        .waiting_for
        .unwrap_or_default()
        .contains("durable sleep"));
    wait_for(&shardq, id, JobStatus::Cancelled, Duration::from_secs(10)).await;
    let (late, error) = ended_after_deadline(&shardq, id).await;
    assert_ended_by_deadline(late, &error);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_handler_gets_cancelled_at_its_next_step_after_the_deadline() {
    let (_shards, shardq) = shardq().await;
    let steps = Arc::new(AtomicUsize::new(0));
    let told = Arc::new(AtomicBool::new(false));
    let mut handlers = HandlerRegistry::new();
    let (s, t) = (steps.clone(), told.clone());
    handlers.register("loop", move |ctx| {
        let (steps, told) = (s.clone(), t.clone());
        async move {
            for i in 0.. {
                let step = ctx.step(&format!("s{i}"), || async { Ok(i) }).await;
                match step {
                    Ok(_) => steps.fetch_add(1, Ordering::SeqCst),
                    Err(e @ StepError::Cancelled(..)) => {
                        told.store(true, Ordering::SeqCst);
                        return Err(e.into());
                    }
                    Err(e) => return Err(e.into()),
                };
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            unreachable!()
        }
    });
    let stop = start_worker(&shardq, handlers);
    let id = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, "loop", json!({})).timeout(Duration::from_secs(2)))
        .await
        .unwrap();
    wait_for(&shardq, id, JobStatus::Cancelled, Duration::from_secs(15)).await;
    assert!(
        told.load(Ordering::SeqCst),
        "the handler saw StepError::Cancelled"
    );
    assert!(
        steps.load(Ordering::SeqCst) > 5,
        "it ran steps before the deadline"
    );
    let (late, error) = ended_after_deadline(&shardq, id).await;
    assert!((0.0..LATE + 1.0).contains(&late), "ended {late:.3} s late");
    assert!(error.starts_with("deadline passed at "), "error: {error}");
    stop.cancel();
}

/// A parent with a 3 s deadline starts three children on the unserved
/// queue: one with a later timeout of its own (it takes the parent's),
/// one with an earlier (it keeps its own), one abandoned (no deadline from
/// the parent); then waits for the first. At the parent's deadline the
/// parent and its children end, but the abandoned one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_inherit_the_earlier_deadline_and_end_with_their_parent_but_abandoned_ones() {
    let (_shards, shardq) = shardq().await;
    let kids = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut handlers = HandlerRegistry::new();
    let k = kids.clone();
    handlers.register("parent", move |ctx| {
        let kids = k.clone();
        async move {
            let later = ctx
                .start_child(NewJob::new(IDLE, "c", json!(1)).timeout(Duration::from_secs(3600)))
                .await?;
            let earlier = ctx
                .start_child(NewJob::new(IDLE, "c", json!(2)).timeout(Duration::from_secs(1)))
                .await?;
            let abandoned = ctx
                .start_child(
                    NewJob::new(IDLE, "c", json!(3)).on_parent_cancel(ChildPolicy::Abandon),
                )
                .await?;
            *kids.lock().unwrap() = vec![later.id(), earlier.id(), abandoned.id()];
            later.result().await?;
            Ok(json!("done"))
        }
    });
    let stop = start_worker(&shardq, handlers);
    let parent = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, "parent", json!({})).timeout(Duration::from_secs(3)))
        .await
        .unwrap();
    wait_for(
        &shardq,
        parent,
        JobStatus::Scheduled,
        Duration::from_secs(10),
    )
    .await;
    let ids = kids.lock().unwrap().clone();
    let (later, earlier, abandoned) = (ids[0], ids[1], ids[2]);
    let db = shardq.shards().get(0).client().await.unwrap();
    let deadline = |id: JobId| {
        let db = &db;
        async move {
            db.query_one(
                "SELECT deadline_at = (SELECT deadline_at FROM workflow_status \
                     WHERE shard_key = $3 AND id = $4) AS parents, deadline_at IS NULL AS none \
                 FROM workflow_status WHERE shard_key = $1 AND id = $2",
                &[&id.shard_key, &id.id, &parent.shard_key, &parent.id],
            )
            .await
            .unwrap()
        }
    };
    assert!(
        deadline(later).await.get::<_, bool>("parents"),
        "the later child takes the parent's"
    );
    let own = deadline(earlier).await;
    assert!(
        !own.get::<_, bool>("parents") && !own.get::<_, bool>("none"),
        "the earlier keeps its own"
    );
    assert!(
        deadline(abandoned).await.get::<_, bool>("none"),
        "an abandoned child has none"
    );
    // A child without the inherited deadline (started before deadlines
    // existed, say) is ended by the cascade from its parent's pass.
    db.execute(
        "UPDATE workflow_status SET deadline_at = NULL WHERE shard_key = $1 AND id = $2",
        &[&later.shard_key, &later.id],
    )
    .await
    .unwrap();
    wait_for(
        &shardq,
        earlier,
        JobStatus::Cancelled,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        status(&shardq, parent).await,
        JobStatus::Scheduled,
        "1 s child first"
    );
    wait_for(
        &shardq,
        parent,
        JobStatus::Cancelled,
        Duration::from_secs(10),
    )
    .await;
    let (late, error) = ended_after_deadline(&shardq, parent).await;
    assert_ended_by_deadline(late, &error);
    wait_for(&shardq, later, JobStatus::Cancelled, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        status(&shardq, abandoned).await,
        JobStatus::Queued,
        "abandoned runs on"
    );
    stop.cancel();
}

/// Key `k`: a job delayed an hour with a 1 s deadline holds the key; the
/// next job of the key waits behind it, and runs once the first ended by
/// its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_job_ended_by_its_deadline_frees_its_key() {
    let (_shards, shardq) = shardq().await;
    let mut handlers = HandlerRegistry::new();
    handlers.register("h", |_ctx| async { Ok(json!("ran")) });
    let stop = start_worker(&shardq, handlers);
    let client = shardq.client();
    let first = client
        .enqueue(
            NewJob::new(QUEUE, "h", json!(1))
                .ordering_key("k")
                .delay(Duration::from_secs(3600))
                .timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap();
    let next = client
        .enqueue(NewJob::new(QUEUE, "h", json!(2)).ordering_key("k"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_ne!(
        status(&shardq, next).await,
        JobStatus::Succeeded,
        "the key was held"
    );
    wait_for(
        &shardq,
        first,
        JobStatus::Cancelled,
        Duration::from_secs(10),
    )
    .await;
    let (late, error) = ended_after_deadline(&shardq, first).await;
    assert_ended_by_deadline(late, &error);
    assert_eq!(
        client.result(next, Duration::from_secs(10)).await.unwrap(),
        shardq::JobOutcome::Succeeded(json!("ran"))
    );
    stop.cancel();
}

/// Every enqueue path writes the deadline: plain, many, deduplicated,
/// debounced, and transactional.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_enqueue_path_writes_the_deadline() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let t = Duration::from_secs(90);
    let job = |n: i64| NewJob::new(IDLE, "h", json!(n)).timeout(t);
    let mut ids = vec![client.enqueue(job(1)).await.unwrap()];
    ids.extend(client.enqueue_many(vec![job(2), job(3)]).await.unwrap());
    ids.push(
        client
            .enqueue(job(4).dedup("once", shardq::OnDuplicate::ReturnExisting))
            .await
            .unwrap(),
    );
    ids.push(
        client
            .enqueue(job(5).debounce("d", Duration::from_secs(60), Duration::from_secs(600)))
            .await
            .unwrap(),
    );
    let routed = client.route(job(6)).unwrap();
    let mut db = routed.shard().client().await.unwrap();
    let tx = db.transaction().await.unwrap();
    ids.push(routed.insert(&*tx).await.unwrap());
    tx.commit().await.unwrap();
    for id in ids {
        assert_eq!(
            deadline_after_creation(&shardq, id).await,
            Some(90.0),
            "{id}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_timeout_is_refused_with_what_to_fix() {
    let (_shards, shardq) = shardq().await;
    let err = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, "h", json!({})).timeout(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("timeout is 0ns"), "{err}");
    assert!(err.to_string().contains("at least 1 ms"), "{err}");
}

mod race {
    //! A deadline racing a completion, driven statement by statement on
    //! the store: whichever commits first decides, and the other changes
    //! nothing final.

    use super::*;

    const OWNER: &str = "racer";
    const RETRY: Backoff = Backoff {
        min: Duration::from_secs(60),
        max: Duration::from_secs(120),
    };

    /// A shard with one running job of `QUEUE` claimed by [`OWNER`], its
    /// deadline passed 0.2 s after its enqueue; the claim.
    async fn running_past_deadline(
        shards: &TestShards,
    ) -> (shardq::shards::ShardSet, shardq::job::ClaimedJob) {
        let config = shards.config("");
        let set = shards.migrated(&config).await;
        let job = NewJob::new(QUEUE, "h", json!({})).timeout(Duration::from_millis(200));
        let rows = [NewRow {
            shard_key: 1,
            job: &job,
            max_attempts: 3,
        }];
        jobs::insert_many(set.get(0), &rows).await.unwrap();
        let params = ClaimParams {
            queue: QUEUE,
            limit: 1,
            owner: OWNER,
            lease: Duration::from_secs(60),
            mode: DequeueMode::Ungated,
        };
        let Claim::Jobs(mut claimed) = jobs::claim(set.get(0), params).await.unwrap() else {
            panic!("the job is claimed")
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        (set, claimed.remove(0))
    }

    async fn complete(
        set: &shardq::shards::ShardSet,
        job: &shardq::job::ClaimedJob,
        outcome: Outcome,
    ) -> jobs::Written {
        jobs::complete_many(
            set.get(0),
            CompleteMany {
                owner: OWNER,
                retry: RETRY,
                done: &[Completion::of(job, outcome)],
            },
        )
        .await
        .unwrap()
    }

    async fn outcome(set: &shardq::shards::ShardSet, id: JobId) -> jobs::JobOutcomeRow {
        jobs::outcome(set.get(0), id).await.unwrap().unwrap()
    }

    /// The completion's transaction holds the row (its update not yet
    /// committed) when the pass runs: the pass skips the row, the success
    /// commits, and a later pass finds nothing to end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_completion_committed_first_stays_a_success() {
        let shards = TestShards::databases(1).await;
        let (set, job) = running_past_deadline(&shards).await;
        let mut db = set.get(0).client().await.unwrap();
        let tx = db.transaction().await.unwrap();
        tx.execute(
            "UPDATE workflow_status SET status = 'succeeded', output = '\"done\"', \
                finished_at = now(), owner = NULL, lease_expires_at = NULL \
             WHERE shard_key = $1 AND id = $2 AND owner = $3 AND fence = $4",
            &[&job.id.shard_key, &job.id.id, &OWNER, &job.fence],
        )
        .await
        .unwrap();
        let pass = deadlines::end_past_deadline(set.get(0), 100).await.unwrap();
        assert_eq!(pass.found, 0, "the row being completed is skipped");
        tx.commit().await.unwrap();
        let pass = deadlines::end_past_deadline(set.get(0), 100).await.unwrap();
        assert_eq!((pass.found, pass.ended.len()), (0, 0));
        let row = outcome(&set, job.id).await;
        assert_eq!(row.status, JobStatus::Succeeded);
        assert_eq!(row.error, None);
    }

    /// The pass commits first (it asks the running job's cancellation),
    /// then the worker's completion: a failure (the handler stopped at
    /// its next step) is written `cancelled` with the deadline's error; a
    /// second completion of that claim is fenced, never a success after
    /// the cancellation.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deadline_committed_first_ends_it_cancelled_and_fences_the_late_completion() {
        let shards = TestShards::databases(1).await;
        let (set, job) = running_past_deadline(&shards).await;
        let pass = deadlines::end_past_deadline(set.get(0), 100).await.unwrap();
        assert_eq!(pass.ended, vec![job.id]);
        // Its children's cancel is owed from the pass's own commit: a
        // process that dies before its cascade leaves it to the workers.
        let owed = set.get(0).client().await.unwrap();
        let owed = owed
            .query("SELECT shard_key, id FROM shardq_cascades_owed", &[])
            .await
            .unwrap();
        let owed: Vec<(i32, i64)> = owed.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(owed, vec![(job.id.shard_key, job.id.id)]);
        assert!(
            jobs::get(set.get(0), job.id)
                .await
                .unwrap()
                .unwrap()
                .cancel_requested
        );
        let written = complete(&set, &job, Outcome::Failed("step cancelled".into())).await;
        assert_eq!(written.cancelled, 1);
        let row = outcome(&set, job.id).await;
        assert_eq!(row.status, JobStatus::Cancelled);
        assert!(
            row.error
                .unwrap_or_default()
                .starts_with("deadline passed at "),
            "the deadline's error is kept"
        );
        let late = complete(&set, &job, Outcome::Succeeded(json!("late"))).await;
        assert_eq!((late.succeeded, late.fenced), (0, 1));
        assert_eq!(outcome(&set, job.id).await.status, JobStatus::Cancelled);
    }

    /// A parked workflow (no owner) ended by the pass: the stale claim's
    /// completion that arrives after is fenced.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_parked_workflow_ended_by_the_pass_fences_a_stale_completion() {
        let shards = TestShards::databases(1).await;
        let (set, job) = running_past_deadline(&shards).await;
        // It parks (as a sleep does: a wake in an hour).
        let db = set.get(0).client().await.unwrap();
        db.execute(
            "UPDATE workflow_status SET run_at = now() + interval '1 hour' \
             WHERE shard_key = $1 AND id = $2",
            &[&job.id.shard_key, &job.id.id],
        )
        .await
        .unwrap();
        let parked = complete(&set, &job, Outcome::Parked).await;
        assert_eq!(parked.fenced, 0);
        assert_eq!(outcome(&set, job.id).await.status, JobStatus::Scheduled);
        let pass = deadlines::end_past_deadline(set.get(0), 100).await.unwrap();
        assert_eq!(pass.ended, vec![job.id]);
        let late = complete(&set, &job, Outcome::Succeeded(json!("late"))).await;
        assert_eq!((late.succeeded, late.fenced), (0, 1));
        let row = outcome(&set, job.id).await;
        assert_eq!(row.status, JobStatus::Cancelled);
        assert!(row
            .error
            .unwrap_or_default()
            .starts_with("deadline passed at "));
    }
}
