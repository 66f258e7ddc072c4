//! Typed jobs: a `serde` struct enqueued as a value and handed to its
//! handler decoded; a payload that does not decode, and a handler's
//! `PermanentFailure`, end the job `dead` on its first attempt, through the
//! same fenced completion as every outcome.

use crate::common;

use common::TestShards;
use serde::{Deserialize, Serialize};
use serde_json::json;
use shardq::config::{Backoff, DequeueMode};
use shardq::job::{Completion, Outcome};
use shardq::shards::Shard;
use shardq::store::jobs::{self, Claim, ClaimParams, CompleteMany, NewRow, Written};
use shardq::{
    ArgsError, HandlerRegistry, JobArgs, JobId, JobInfo, JobStatus, NewJob, PermanentFailure,
    Shardq,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "typed";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SendEmail {
    to: String,
    subject: String,
    cc: Vec<String>,
    attachment_bytes: Option<u64>,
}

impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
}

fn email() -> SendEmail {
    SendEmail {
        to: "a@example.com".into(),
        subject: "Grüße \"quoted\"".into(),
        cc: vec!["b@example.com".into(), "c@example.com".into()],
        attachment_bytes: Some(u64::from(u32::MAX) + 1),
    }
}

/// A migrated shard whose worker retries a failure after 10-20 ms: a job
/// that were retried would use up its attempts within the test.
async fn shardq() -> (TestShards, Shardq) {
    let shards = TestShards::databases(1).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nretry_backoff_min_ms = 10\nretry_backoff_max_ms = 20\n"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    (shards, shardq)
}

/// Runs a worker with `handlers` until every job of `ids` has finished,
/// and returns each job's row.
async fn run_until_finished(
    shardq: &Shardq,
    handlers: HandlerRegistry,
    ids: &[JobId],
) -> Vec<JobInfo> {
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    for &id in ids {
        // Generous: CI shares two cores between builds.
        shardq
            .client()
            .result(id, Duration::from_secs(60))
            .await
            .expect("the job finishes");
    }
    stop.cancel();
    worker.await.unwrap();
    let mut rows = Vec::new();
    for &id in ids {
        rows.push(shardq.client().job(id).await.unwrap().expect("the job"));
    }
    rows
}

#[test]
fn a_typed_job_is_a_job_of_its_kind_with_its_arguments_as_payload() {
    let job = NewJob::from_args(QUEUE, &email())
        .unwrap()
        .ordering_key("user-1");
    assert_eq!(job.handler, "send_email");
    assert_eq!(job.queue, QUEUE);
    assert_eq!(job.ordering_key.as_deref(), Some("user-1"));
    assert_eq!(job.payload, serde_json::to_value(email()).unwrap());

    // Arguments JSON cannot hold: the error names the kind.
    #[derive(Serialize, Deserialize)]
    struct ByPair(HashMap<(u8, u8), u8>);
    impl JobArgs for ByPair {
        const KIND: &'static str = "by_pair";
    }
    let err = NewJob::from_args(QUEUE, &ByPair(HashMap::from([((1, 2), 3)]))).unwrap_err();
    assert!(
        matches!(
            err,
            ArgsError::Serialize {
                kind: "by_pair",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        shardq::error_chain(&err),
        "arguments of job kind `by_pair` do not serialize as JSON: key must be a string"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_job_reaches_its_handler_as_the_struct_and_writes_its_output() {
    let (_pg, shardq) = shardq().await;
    let id = shardq
        .client()
        .enqueue(NewJob::from_args(QUEUE, &email()).unwrap())
        .await
        .unwrap();

    let seen: Arc<Mutex<Vec<(SendEmail, JobId)>>> = Arc::default();
    let mut handlers = HandlerRegistry::new();
    let record = seen.clone();
    handlers.register_typed(move |args: SendEmail, ctx| {
        let record = record.clone();
        async move {
            let output = json!({ "sent_to": args.to, "cc": args.cc.len() });
            record.lock().unwrap().push((args, ctx.id));
            Ok(output)
        }
    });
    let rows = run_until_finished(&shardq, handlers, &[id]).await;

    assert_eq!(*seen.lock().unwrap(), vec![(email(), id)], "decoded intact");
    let row = &rows[0];
    assert_eq!(row.handler, "send_email");
    assert_eq!(row.status, JobStatus::Succeeded);
    assert_eq!(row.attempts, 1);
    assert_eq!(
        row.output,
        Some(json!({ "sent_to": "a@example.com", "cc": 2 }))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_that_does_not_decode_ends_dead_after_one_attempt_naming_the_field() {
    let (_pg, shardq) = shardq().await;
    // A JSON enqueue (the CLI's, another language's) without `to`.
    let payload = json!({ "subject": "hi", "cc": [], "attachment_bytes": null });
    let id = shardq
        .client()
        .enqueue(NewJob::new(QUEUE, SendEmail::KIND, payload).max_attempts(5))
        .await
        .unwrap();

    let calls = Arc::new(Mutex::new(0));
    let mut handlers = HandlerRegistry::new();
    let count = calls.clone();
    handlers.register_typed(move |_: SendEmail, _ctx| {
        *count.lock().unwrap() += 1;
        async { Ok(serde_json::Value::Null) }
    });
    let rows = run_until_finished(&shardq, handlers, &[id]).await;

    let row = &rows[0];
    assert_eq!(
        (row.status, row.attempts, row.max_attempts),
        (JobStatus::Dead, 1, 5),
        "dead on its first attempt, not retried: {row:?}"
    );
    assert_eq!(
        row.error.as_deref(),
        Some("payload of job kind `send_email` does not decode: missing field `to`")
    );
    assert!(row.finished_at.is_some());
    assert_eq!(*calls.lock().unwrap(), 0, "the handler never ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_ends_dead_at_once_and_any_other_error_is_retried() {
    let (_pg, shardq) = shardq().await;
    let client = shardq.client();
    let enqueue = |handler: &str| {
        let job = NewJob::new(QUEUE, handler, json!({})).max_attempts(3);
        client.enqueue(job)
    };
    let permanent = enqueue("refused").await.unwrap();
    let wrapped = enqueue("refused_in_a_step").await.unwrap();
    let passing = enqueue("flaky").await.unwrap();

    let mut handlers = HandlerRegistry::new();
    handlers.register("refused", |_ctx| async {
        Err(PermanentFailure::new("the card number is malformed").into())
    });
    // From inside a step, the failure arrives wrapped in `StepError::Failed`.
    handlers.register("refused_in_a_step", |ctx| async move {
        let charged: u32 = ctx
            .step("charge", || async {
                Err(PermanentFailure::new("the card was declined for good").into())
            })
            .await?;
        Ok(json!(charged))
    });
    handlers.register("flaky", |_ctx| async { Err("try again".into()) });
    let rows = run_until_finished(&shardq, handlers, &[permanent, wrapped, passing]).await;

    let seen: Vec<_> = rows
        .iter()
        .map(|r| (r.status, r.attempts, r.error.as_deref().unwrap_or_default()))
        .collect();
    assert_eq!(
        seen,
        [
            (JobStatus::Dead, 1, "the card number is malformed"),
            (
                JobStatus::Dead,
                1,
                "step `charge` failed: the card was declined for good"
            ),
            (JobStatus::Dead, 3, "try again"),
        ]
    );
}

/// The permanent failure is one more asked status of the fenced completion:
/// a stale claim's is fenced out, and a repeat of the write (its reply
/// lost) is counted as written already, not written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_is_fenced_and_written_once() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let shard = set.get(0);
    let job = NewJob::new(QUEUE, "h", json!({}));
    let row = NewRow {
        shard_key: 1,
        job: &job,
        max_attempts: 3,
    };
    let id = jobs::insert_many(shard, &[row]).await.unwrap()[0];
    let params = ClaimParams {
        queue: QUEUE,
        limit: 1,
        owner: "worker-a",
        lease: Duration::from_secs(60),
        mode: DequeueMode::Ungated,
    };
    let Claim::Jobs(claimed) = jobs::claim(shard, params).await.unwrap() else {
        panic!("the job is claimed");
    };
    let dead = Completion::of(&claimed[0], Outcome::Dead("no retry mends this".into()));

    let mut stale = dead.clone();
    stale.fence += 1;
    let w = write(shard, &stale).await;
    assert_eq!((w.total(), w.fenced), (0, 1));
    let row = jobs::get(shard, id).await.unwrap().unwrap();
    assert_eq!(
        row.status,
        JobStatus::Running,
        "a stale claim changes nothing"
    );

    let w = write(shard, &dead).await;
    assert_eq!(
        w,
        Written {
            dead: 1,
            ..Written::default()
        }
    );
    let row = jobs::get(shard, id).await.unwrap().unwrap();
    assert_eq!((row.status, row.attempts), (JobStatus::Dead, 1));
    assert_eq!(row.error.as_deref(), Some("no retry mends this"));
    let finished = row.finished_at.clone();
    assert!(finished.is_some());

    let w = write(shard, &dead).await;
    assert_eq!(
        w,
        Written {
            dead: 1,
            already: 1,
            ..Written::default()
        }
    );
    let row = jobs::get(shard, id).await.unwrap().unwrap();
    assert_eq!(row.finished_at, finished, "not written again");
}

/// Writes `done` alone, as worker-a.
async fn write(shard: &Shard, done: &Completion) -> Written {
    let p = CompleteMany {
        owner: "worker-a",
        // Long: a job scheduled for a retry would still be scheduled after the test.
        retry: Backoff {
            min: Duration::from_secs(60),
            max: Duration::from_secs(60),
        },
        done: std::slice::from_ref(done),
    };
    jobs::complete_many(shard, p).await.unwrap()
}
