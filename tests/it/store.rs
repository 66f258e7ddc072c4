//! Every operation of `shardq::store` against a real PostgreSQL server: one
//! test per operation or small group, each asserting what the operation did
//! to the rows (not only that it returned `Ok`). Rows are set up through the
//! store's own operations; direct SQL only arranges states no operation
//! makes (a lease in the past, an old `finished_at`) or holds locks.

use crate::common;

use common::TestShards;
use serde_json::{json, Value};
use shardq::config::{Backoff, Config, DequeueMode};
use shardq::job::{ClaimedJob, Completion, Outcome};
use shardq::shards::{Shard, ShardError, ShardSet};
use shardq::store::jobs::{self, Claim, ClaimParams, CompleteMany, ExtendLeases, NewRow, Written};
use shardq::store::{locks, queues, schema, steps, upkeep, ErrorKind, JobStatus};
use shardq::{JobId, NewJob};
use std::time::{Duration, Instant};

const OWNER: &str = "worker-a";
const LEASE: Duration = Duration::from_secs(60);
/// Long enough that a retry never becomes due during a test.
const RETRY: Backoff = Backoff {
    min: Duration::from_secs(60),
    max: Duration::from_secs(120),
};

/// One migrated shard on its own server.
async fn one_shard(extra: &str) -> (TestShards, Config, ShardSet) {
    let shards = TestShards::databases(1).await;
    let config = shards.config(extra);
    let set = shards.migrated(&config).await;
    (shards, config, set)
}

/// Inserts `jobs` with shard keys 1, 2, … and their own attempt limits (3
/// when unset).
async fn insert(shard: &Shard, jobs: &[NewJob]) -> Vec<JobId> {
    let rows: Vec<NewRow> = jobs
        .iter()
        .enumerate()
        .map(|(i, job)| NewRow {
            shard_key: i as i32 + 1,
            job,
            max_attempts: job.max_attempts.unwrap_or(3),
        })
        .collect();
    jobs::insert_many(shard, &rows).await.expect("insert")
}

fn job(queue: &str, n: i64) -> NewJob {
    NewJob::new(queue, "h", json!({ "n": n }))
}

fn params<'a>(queue: &'a str, limit: u32, owner: &'a str) -> ClaimParams<'a> {
    ClaimParams {
        queue,
        limit,
        owner,
        lease: LEASE,
        mode: DequeueMode::Ungated,
    }
}

/// Claims up to `limit` jobs of `queue` for `owner`; none when empty.
async fn claim(shard: &Shard, queue: &str, limit: u32, owner: &str) -> Vec<ClaimedJob> {
    match jobs::claim(shard, params(queue, limit, owner))
        .await
        .expect("claim")
    {
        Claim::Jobs(jobs) => jobs,
        Claim::Empty => Vec::new(),
        Claim::HeldBack(jobs) => jobs,
        Claim::Busy => panic!("an ungated claim is never busy"),
    }
}

async fn complete(shard: &Shard, owner: &str, done: &[Completion]) -> Written {
    jobs::complete_many(
        shard,
        CompleteMany {
            owner,
            retry: RETRY,
            done,
        },
    )
    .await
    .expect("complete")
}

async fn info(shard: &Shard, id: JobId) -> jobs::JobInfo {
    jobs::get(shard, id)
        .await
        .expect("get")
        .expect("job exists")
}

async fn status(shard: &Shard, id: JobId) -> JobStatus {
    info(shard, id).await.status
}

/// Runs `text` (setup SQL) on a user connection.
async fn exec(shard: &Shard, text: &str) {
    let client = shard.user_client().await.expect("user client");
    client.batch_execute(text).await.expect("setup sql");
}

/// One value `text` returns on a user connection.
async fn scalar<T>(shard: &Shard, text: &str) -> T
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    let client = shard.user_client().await.expect("user client");
    client.query_one(text, &[]).await.expect("sql").get(0)
}

/// Seconds from now until the job's `column` timestamp (negative: past).
async fn seconds_until(shard: &Shard, id: JobId, column: &str) -> f64 {
    scalar(
        shard,
        &format!(
            "SELECT extract(epoch FROM {column} - now())::float8 FROM workflow_status \
             WHERE shard_key = {} AND id = {}",
            id.shard_key, id.id
        ),
    )
    .await
}

fn where_id(id: JobId) -> String {
    format!("shard_key = {} AND id = {}", id.shard_key, id.id)
}

fn expect_err<T: std::fmt::Debug>(r: Result<T, ShardError>, what: &str) -> ShardError {
    match r {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => e,
    }
}

// ---------------------------------------------------------------- store::jobs

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
    assert!(done.keyed);
    let w = complete(shard, OWNER, &[done]).await;
    assert_eq!(w.succeeded, 1);
    assert_eq!(status(shard, ids[1]).await, JobStatus::Queued);
    let next = claim(shard, "q", 10, OWNER).await;
    assert_eq!(next[0].id, ids[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_leases_moves_only_rows_held_under_the_same_owner_and_fence() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    insert(shard, &[job("q", 0), job("q", 1), job("q", 2)]).await;
    let short = ClaimParams {
        lease: Duration::from_secs(5),
        ..params("q", 10, OWNER)
    };
    let Claim::Jobs(claimed) = jobs::claim(shard, short).await.unwrap() else {
        panic!("claim");
    };
    let [a, b, c] = [claimed[0].id, claimed[1].id, claimed[2].id];
    let f = claimed[0].fence;
    // c finished: no owner any more.
    complete(
        shard,
        OWNER,
        &[Completion::of(&claimed[2], Outcome::Succeeded(json!(1)))],
    )
    .await;
    let held = [(a, f), (b, f + 1), (c, f)];
    let extend = |owner| ExtendLeases {
        owner,
        held: &held,
        lease: Duration::from_secs(600),
    };
    assert_eq!(
        jobs::extend_leases(shard, extend("worker-b"))
            .await
            .unwrap(),
        0
    );
    assert_eq!(jobs::extend_leases(shard, extend(OWNER)).await.unwrap(), 1);
    let lease_a = seconds_until(shard, a, "lease_expires_at").await;
    let lease_b = seconds_until(shard, b, "lease_expires_at").await;
    assert!((590.0..=600.0).contains(&lease_a), "a: {lease_a} s");
    assert!(
        lease_b <= 5.0,
        "b with a stale fence was extended: {lease_b} s"
    );
    assert_eq!(status(shard, c).await, JobStatus::Succeeded);
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
async fn owned_running_finds_an_owners_running_jobs_older_than_age() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let ids = insert(
        shard,
        &[job("q", 0), job("q", 1).ordering_key("k"), job("q", 2)],
    )
    .await;
    let mine = claim(shard, "q", 2, OWNER).await;
    assert_eq!(mine.len(), 2);
    let theirs = claim(shard, "q", 10, "worker-b").await;
    assert_eq!(theirs[0].id, ids[2]);

    let mut found = jobs::owned_running(shard, OWNER, Duration::ZERO)
        .await
        .unwrap();
    found.sort_by_key(|r| r.id.id);
    assert_eq!(
        found,
        vec![
            jobs::OwnedRunning {
                id: ids[0],
                fence: 1,
                keyed: false
            },
            jobs::OwnedRunning {
                id: ids[1],
                fence: 1,
                keyed: true
            },
        ]
    );
    assert!(jobs::owned_running(shard, OWNER, Duration::from_secs(300))
        .await
        .unwrap()
        .is_empty());
    exec(
        shard,
        &format!(
            "UPDATE workflow_status SET started_at = now() - interval '10 min' WHERE {}",
            where_id(ids[1])
        ),
    )
    .await;
    let old = jobs::owned_running(shard, OWNER, Duration::from_secs(300))
        .await
        .unwrap();
    assert_eq!(old.iter().map(|r| r.id).collect::<Vec<_>>(), vec![ids[1]]);
    // Finished jobs are not running any more.
    complete(
        shard,
        OWNER,
        &[Completion::of(&mine[0], Outcome::Succeeded(json!(1)))],
    )
    .await;
    let left = jobs::owned_running(shard, OWNER, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(left.iter().map(|r| r.id).collect::<Vec<_>>(), vec![ids[1]]);
}

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

// -------------------------------------------------------------- store::queues

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

    let mut got: Vec<(String, String, i64, bool)> = queues::counts(shard)
        .await
        .unwrap()
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

// -------------------------------------------------------------- store::upkeep

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

// --------------------------------------------------------------- store::steps

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_record_is_fenced_and_get_reads_it_back() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let id = insert(shard, &[job("q", 0)]).await[0];
    assert_eq!(steps::get(shard, id, "fetch").await.unwrap(), None);
    let c = claim(shard, "q", 1, OWNER).await.remove(0);
    let out = json!({ "rows": 3 });
    let null = Value::Null;
    let step = |name, output, owner, fence| steps::RecordStep {
        id,
        name,
        output,
        owner,
        fence,
    };
    assert!(steps::record(shard, step("fetch", &out, OWNER, c.fence))
        .await
        .unwrap());
    assert_eq!(
        steps::get(shard, id, "fetch").await.unwrap(),
        Some(Some(out.clone()))
    );
    // A JSON null is a recorded output.
    assert!(steps::record(shard, step("nothing", &null, OWNER, c.fence))
        .await
        .unwrap());
    assert_eq!(
        steps::get(shard, id, "nothing").await.unwrap(),
        Some(Some(Value::Null))
    );
    // Stale fence, other owner: refused.
    assert!(
        !steps::record(shard, step("late", &out, OWNER, c.fence - 1))
            .await
            .unwrap()
    );
    assert!(
        !steps::record(shard, step("late", &out, "worker-b", c.fence))
            .await
            .unwrap()
    );
    assert_eq!(steps::get(shard, id, "late").await.unwrap(), None);
    // Cancellation asked: refused.
    jobs::cancel(shard, id).await.unwrap();
    assert!(!steps::record(shard, step("late", &out, OWNER, c.fence))
        .await
        .unwrap());
    assert_eq!(steps::get(shard, id, "late").await.unwrap(), None);
    // Steps belong to their workflow.
    let other = JobId {
        shard_key: id.shard_key,
        id: id.id + 1000,
    };
    assert_eq!(steps::get(shard, other, "fetch").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_record_repeated_says_recorded_and_keeps_the_first_output() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let id = insert(shard, &[job("q", 0)]).await[0];
    let c = claim(shard, "q", 1, OWNER).await.remove(0);
    let out = json!({ "rows": 3 });
    let other_out = json!("other");
    let step = |output| steps::RecordStep {
        id,
        name: "fetch",
        output,
        owner: OWNER,
        fence: c.fence,
    };
    assert!(steps::record(shard, step(&out)).await.unwrap());
    // The documented contract: "Returns whether it is recorded (now or
    // before)"; "a repeat finds the step recorded".
    let again = steps::record(shard, step(&other_out)).await.unwrap();
    assert_eq!(
        steps::get(shard, id, "fetch").await.unwrap(),
        Some(Some(out.clone()))
    );
    assert!(
        again,
        "a repeat of a recorded step is reported as not recorded"
    );
}

// ------------------------------------------ store::schema, create_database

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_reads_versions_and_shard_map_and_create_database_is_idempotent() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("");
    let set = ShardSet::connect(&config).unwrap();
    let (migrated, fresh) = (set.get(0), set.get(1));
    shardq::migrate::migrate_shard(migrated, 2).await.unwrap();

    let latest = shardq::migrate::latest_version();
    assert_eq!(
        schema::current_version(migrated).await.unwrap(),
        Some(latest)
    );
    assert_eq!(
        schema::applied(migrated).await.unwrap(),
        // Versions may skip numbers (reserved by branches merged later).
        shardq::migrate::MIGRATIONS
            .iter()
            .map(|m| m.version)
            .collect::<Vec<_>>()
    );
    assert_eq!(schema::shard_map(migrated).await.unwrap(), Some((2, 0)));

    assert_eq!(schema::current_version(fresh).await.unwrap(), None);
    assert!(schema::applied(fresh).await.unwrap().is_empty());
    assert_eq!(schema::shard_map(fresh).await.unwrap(), None);
    shardq::migrate::migrate_shard(fresh, 2).await.unwrap();
    assert_eq!(schema::shard_map(fresh).await.unwrap(), Some((2, 1)));

    // create_database, twice, with a name that needs quoting.
    let name = "store \"new\" db";
    for _ in 0..2 {
        shardq_local::create_database(&shards.servers[0].admin_url(), name)
            .await
            .expect("create database (again)");
    }
    let (admin, connection) =
        tokio_postgres::connect(&shards.servers[0].admin_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    let n: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    // The new database is a fresh shard: no schema.
    let fresh_config = Config::from_toml(&format!(
        "[[shards]]\nname = \"n\"\nurl = \"{}\"\n",
        shards.urls[0].rsplit_once('/').unwrap().0.to_string() + "/store%20%22new%22%20db"
    ))
    .unwrap();
    let fresh_set = ShardSet::connect(&fresh_config).unwrap();
    assert_eq!(
        schema::current_version(fresh_set.get(0)).await.unwrap(),
        None
    );
    drop(admin);
    let _ = connection.await;
}

// ------------------------------------------------------------ ShardError::kind

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kind_classifies_lock_timeout_cancel_and_a_stopped_server() {
    let (pg, _config, set) = one_shard(
        "[dequeue]\nlock_timeout_ms = 300\nstatement_timeout_ms = 5000\nconnect_timeout_ms = 1000\n",
    )
    .await;
    let shard = set.get(0);
    let id = insert(shard, &[job("q", 0)]).await[0];

    // lock_timeout under a table lock.
    let mut locker = shard.user_client().await.unwrap();
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE workflow_status IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let started = Instant::now();
    let err = expect_err(jobs::get(shard, id).await, "get under a table lock");
    assert_eq!(err.kind(), ErrorKind::LockNotAvailable, "{err:?}");
    assert!(!err.is_permanent());
    assert!(started.elapsed() < Duration::from_secs(3));
    let err = expect_err(
        jobs::claim(shard, params("q", 10, OWNER)).await,
        "claim under a table lock",
    );
    assert_eq!(err.kind(), ErrorKind::LockNotAvailable, "{err:?}");

    // A statement the server cancels (pg_cancel_backend), through pools
    // without lock_timeout so it waits for the table lock.
    let waiting_config = pg.config("[dequeue]\nlock_timeout_ms = 0\nstatement_timeout_ms = 5000\n");
    let waiting_set = ShardSet::connect(&waiting_config).unwrap();
    let blocked = {
        let shard = waiting_set.get(0).clone();
        tokio::spawn(async move { jobs::get(&shard, id).await })
    };
    let canceller = shard.user_client().await.unwrap();
    let mut cancelled = false;
    for _ in 0..200 {
        let n: i64 = canceller
            .query_one(
                "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = 'shardq' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            cancelled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(cancelled, "no blocked statement to cancel");
    let err = expect_err(blocked.await.unwrap(), "cancelled statement");
    assert_eq!(err.kind(), ErrorKind::QueryCanceled, "{err:?}");
    assert!(!err.is_permanent());
    tx.rollback().await.unwrap();
    drop(locker);
    drop(canceller);

    // A stopped server.
    pg.servers[0]
        .stop(shardq_local::StopMode::Immediate)
        .unwrap();
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let err = expect_err(jobs::exists(shard, id).await, "stopped server");
        kinds.push(err.kind());
    }
    assert!(
        kinds
            .iter()
            .all(|k| matches!(k, ErrorKind::Unreachable | ErrorKind::NoAnswer)),
        "{kinds:?}"
    );
    assert_eq!(kinds.last(), Some(&ErrorKind::Unreachable), "{kinds:?}");
}

/// `ErrorKind::QueryCanceled` documents `statement_timeout` as its cause, and
/// `NoAnswer` as "the statement may have run". But `Shard::within` puts the
/// client-side deadline at the same `dequeue.statement_timeout_ms` and
/// starts it before the statement is sent, so it always fires first: a
/// server-cancelled statement is reported as `NoAnswer` (and its connection
/// abandoned mid-statement).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_timeout_is_query_canceled() {
    let (pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let id = insert(shard, &[job("q", 0)]).await[0];
    let mut locker = shard.user_client().await.unwrap();
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE workflow_status IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let config = pg.config("[dequeue]\nlock_timeout_ms = 0\nstatement_timeout_ms = 300\n");
    let timed = ShardSet::connect(&config).unwrap();
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let err = expect_err(jobs::get(timed.get(0), id).await, "statement_timeout");
        kinds.push(err.kind());
    }
    tx.rollback().await.unwrap();
    assert!(
        kinds.iter().all(|k| *k == ErrorKind::QueryCanceled),
        "{kinds:?}"
    );
}
