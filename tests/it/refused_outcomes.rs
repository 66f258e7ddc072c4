//! A refused failure write never keeps a job `running` forever (issue 21,
//! §2.5): the retry backoff cannot overflow however many attempts a job has
//! had, absurd attempt counts and leases are refused up front, and a job
//! whose outcome the database refuses for good goes back by its lease
//! instead of having it renewed for as long as the process lives.

use crate::common;

use common::TestShards;
use serde_json::json;
use shardq::config::{Backoff, DequeueMode};
use shardq::job::{Completion, Outcome};
use shardq::store::jobs::{self, Claim, ClaimParams, CompleteMany, NewRow};
use shardq::{Client, Config, HandlerRegistry, NewJob, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_a_thousand_attempts_gets_the_longest_backoff() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let shard = set.get(0);
    let job = NewJob::new("q", "h", json!({}));
    let ids = jobs::insert_many(
        shard,
        &[NewRow {
            shard_key: 1,
            job: &job,
            max_attempts: 1_000,
        }],
    )
    .await
    .unwrap();
    // A row from before attempt counts were bounded: 1,099 attempts behind it.
    shard
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET attempts = 1099, max_attempts = 5000 WHERE id = $1",
            &[&ids[0].id],
        )
        .await
        .unwrap();
    let claimed = match jobs::claim(
        shard,
        ClaimParams {
            queue: "q",
            limit: 1,
            owner: "w",
            lease: Duration::from_secs(60),
            mode: DequeueMode::Ungated,
        },
    )
    .await
    .unwrap()
    {
        Claim::Jobs(jobs) => jobs,
        other => panic!("{other:?}"),
    };
    assert_eq!(claimed[0].attempt, 1_100);
    let retry = Backoff {
        min: Duration::from_secs(1),
        max: Duration::from_secs(600),
    };
    let done = [Completion::of(&claimed[0], Outcome::Failed("again".into()))];
    let written = jobs::complete_many(
        shard,
        CompleteMany {
            owner: "w",
            retry,
            done: &done,
        },
    )
    .await
    .expect("the failure is written, its backoff capped");
    assert_eq!(written.retrying, 1);
    let row = shard
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT status, extract(epoch FROM run_at - now())::float8 AS delay_s \
             FROM workflow_status WHERE id = $1",
            &[&ids[0].id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>("status"), "scheduled");
    let delay: f64 = row.get("delay_s");
    // Jittered within half to all of the longest backoff.
    assert!((290.0..=600.0).contains(&delay), "retry in {delay} s");
}

fn refused(toml: &str) -> String {
    match Config::from_toml(toml) {
        Ok(_) => panic!("accepted: {toml}"),
        Err(err) => err.to_string(),
    }
}

#[test]
fn absurd_attempts_leases_and_backoffs_are_refused_with_the_key_and_the_fix() {
    let shard = "[[shards]]\nname = \"a\"\nurl = \"postgres://u@127.0.0.1:1/d\"\n";
    let cases = [
        (
            "[limits]\ndefault_max_attempts = 100000",
            "limits.default_max_attempts = 100000",
        ),
        (
            "[worker]\nlease_ms = 31536000000",
            "worker.lease_ms = 31536000000",
        ),
        (
            "[worker]\nretry_backoff_max_ms = 31536000000",
            "worker.retry_backoff_max_ms = 31536000000",
        ),
        (
            "[worker]\ncompletion_batch = 1000000",
            "worker.completion_batch = 1000000",
        ),
    ];
    for (section, expected) in cases {
        let message = refused(&format!("{shard}{section}\n"));
        assert!(message.starts_with(expected), "{message}");
        assert!(message.contains("at most"), "{message}");
    }
    // The bounds themselves pass.
    Config::from_toml(&format!(
        "{shard}[limits]\ndefault_max_attempts = 1000\n[worker]\nlease_ms = 86400000\n\
         retry_backoff_max_ms = 604800000\ncompletion_batch = 5000\n"
    ))
    .expect("the bounds themselves are valid");
    // A job's own attempt count has the same bound.
    let limits = Config::from_toml(shard).unwrap().limits;
    let err = NewJob::new("q", "h", json!({}))
        .max_attempts(1_000_000)
        .validate(&limits)
        .unwrap_err();
    assert!(err.to_string().contains("at most 1000"), "{err}");
    NewJob::new("q", "h", json!({}))
        .max_attempts(1_000)
        .validate(&limits)
        .unwrap();
}

/// Refuses (SQLSTATE 23514) every write that ends a claim of a job whose
/// payload says `refuse`, as a user's trigger might: the completion and the
/// failure written in its place alike. Lease recovery, which raises the
/// fence, passes.
const REFUSE_OUTCOMES: &str = "
CREATE FUNCTION refuse_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'running' AND NEW.status <> 'running' AND NEW.fence = OLD.fence THEN
        RAISE EXCEPTION 'outcomes of this job are refused' USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_outcome BEFORE UPDATE ON workflow_status FOR EACH ROW
    WHEN (OLD.payload ? 'refuse') EXECUTE FUNCTION refuse_outcome();
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_outcome_is_refused_for_good_returns_by_its_lease() {
    blocked_outcome_returns_by_its_lease(REFUSE_OUTCOMES, "refuse").await;
}

/// Runs a job whose outcome `trigger` keeps from being written (the job's
/// payload carries `marker`) and waits until recovery ends it: its process
/// let it go, so its lease (2 s) expired; its one attempt was used.
async fn blocked_outcome_returns_by_its_lease(trigger: &str, marker: &str) {
    let shards = TestShards::databases(1).await;
    let config = shards.config(
        "[dequeue]\nempty_backoff_min_ms = 5\nempty_backoff_max_ms = 20\n\
         [worker]\nqueues = [\"q\"]\nlease_ms = 2000\nmaintenance_interval_ms = 200\n",
    );
    let set = shards.migrated(&config).await;
    set.get(0)
        .client()
        .await
        .unwrap()
        .batch_execute(trigger)
        .await
        .unwrap();
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let id = client
        .enqueue(NewJob::new("q", "noop", json!({ marker: true })).max_attempts(1))
        .await
        .unwrap();

    let worker = Worker::new(config, set.clone(), HandlerRegistry::with_builtins());
    let stats = worker.stats();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    common::wait_until(Duration::from_secs(30), "the job was run", || async {
        stats.snapshot().claimed >= 1
    })
    .await;
    // Its outcome cannot be written; the process lets it go, so its lease
    // (2 s) expires and recovery ends it: its one attempt was used.
    common::wait_until(
        Duration::from_secs(30),
        "the job is no longer running (its lease not renewed forever)",
        || async {
            let job = client.job(id).await.unwrap().unwrap();
            job.status == shardq::JobStatus::Dead
        },
    )
    .await;
    let job = client.job(id).await.unwrap().unwrap();
    assert!(
        job.error.as_deref().unwrap_or("").contains("lease expired"),
        "{:?}",
        job.error
    );
    shutdown.cancel();
    running.await.unwrap();
}

/// Refuses every write that ends a claim of a job whose payload says
/// `no_room`, as a server out of lock room does (SQLSTATE 53200): not a
/// refusal of the data, so the completer retries it; lease extensions pass.
const NO_ROOM_FOR_OUTCOMES: &str = "
CREATE FUNCTION no_room_for_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'running' AND NEW.status <> 'running' AND NEW.fence = OLD.fence THEN
        RAISE EXCEPTION 'out of shared memory' USING ERRCODE = 'out_of_memory',
            HINT = 'You might need to increase max_locks_per_transaction.';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER no_room_for_outcome BEFORE UPDATE ON workflow_status FOR EACH ROW
    WHEN (OLD.payload ? 'no_room') EXECUTE FUNCTION no_room_for_outcome();
";

/// Issue 21, open item of §2.1: a single outcome that the server refuses with
/// 53200 cannot be split; retried without bound while the leaser renewed its
/// lease, the job stayed `running` for as long as the server was short of
/// room. It is given up after a few tries, so its lease expires and recovery
/// ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_outcome_the_server_has_no_room_for_returns_by_its_lease() {
    blocked_outcome_returns_by_its_lease(NO_ROOM_FOR_OUTCOMES, "no_room").await;
}
