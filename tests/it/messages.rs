//! Messages to a workflow (`Client::send`, `JobContext::send` and
//! `recv`): a mailbox that keeps a message sent before the workflow waits,
//! gives a topic's messages in send order, each once; a send wakes a
//! workflow parked on its topic; a recv times out by the shard's clock; an
//! idempotency key (and a replayed `ctx.send`) delivers once; a send to a
//! missing or finished workflow is refused; and a timeout that races a
//! message is decided under the workflow's row lock.

use crate::common;

use common::TestShards;
use serde_json::{json, Value};
use shardq::store::messages::{self, Received, Recv};
use shardq::store::sql;
use shardq::tokio_postgres::types::Type;
use shardq::{
    ClientError, HandlerRegistry, JobId, JobOutcome, JobStatus, NewJob, Shardq, StepError,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "mailbox";
/// A queue no worker of these tests serves: its jobs stay unfinished.
const IDLE: &str = "idle";

/// A migrated shard whose worker runs one job at a time and retries a
/// failure after 10-20 ms.
async fn shardq() -> (TestShards, Shardq) {
    shardq_with("").await
}

/// [`shardq`] with more `[worker]` settings.
async fn shardq_with(worker: &str) -> (TestShards, Shardq) {
    let shards = TestShards::databases(1).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nconcurrency = 1\n\
         retry_backoff_min_ms = 10\nretry_backoff_max_ms = 20\n{worker}"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    (shards, shardq)
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

/// The workflow's messages: (topic, message, received_by_step), in `seq` order.
async fn mailbox(shardq: &Shardq, id: JobId) -> Vec<(String, Value, Option<String>)> {
    shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .query(
            "SELECT topic, message, received_by_step FROM workflow_messages \
             WHERE shard_key = $1 AND workflow_id = $2 ORDER BY seq",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

async fn all_messages(shardq: &Shardq) -> i64 {
    shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .query_one("SELECT count(*) FROM workflow_messages", &[])
        .await
        .unwrap()
        .get(0)
}

/// Messages sent before the workflow runs are received at once (it never
/// parks: one run), a topic's three in send order, each once; the other
/// topic's message stays in the mailbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_sent_before_the_wait_are_received_at_once_in_order_each_once() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let runs = Arc::new(Mutex::new(0));
    let mut handlers = HandlerRegistry::new();
    let counted = runs.clone();
    handlers.register("inbox", move |ctx| {
        let counted = counted.clone();
        async move {
            *counted.lock().unwrap() += 1;
            let mut got = Vec::new();
            for _ in 0..3 {
                got.push(ctx.recv("a", Duration::from_secs(30)).await?);
            }
            Ok(json!(got))
        }
    });
    let id = client
        .enqueue(NewJob::new(QUEUE, "inbox", json!({})))
        .await
        .unwrap();
    client.send(id, "b", json!("other"), None).await.unwrap();
    for n in 1..=3 {
        client.send(id, "a", json!(n), None).await.unwrap();
    }
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    let outcome = client.result(id, Duration::from_secs(30)).await.unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(json!([1, 2, 3])));
    assert_eq!(*runs.lock().unwrap(), 1, "it never parked: one run");
    let step = |n: &str| Some(format!("shardq:recv:{n}"));
    assert_eq!(
        mailbox(&shardq, id).await,
        vec![
            ("b".to_string(), json!("other"), None),
            ("a".to_string(), json!(1), step("1")),
            ("a".to_string(), json!(2), step("2")),
            ("a".to_string(), json!(3), step("3")),
        ],
        "each `a` taken once, in send order, by its own recv; `b` left"
    );
}

/// A workflow parked in a recv (status `scheduled`, its run_at the
/// deadline a minute away) is woken by a send of its topic and receives
/// the message well before the deadline, keyed or not: the send queues
/// it (under its key's lock when it has a key), not the promotion of due
/// jobs, which runs here once a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_workflow_is_woken_by_a_send_and_receives_it() {
    let (_shards, shardq) = shardq_with("maintenance_interval_ms = 60000\n").await;
    let client = shardq.client();
    let mut handlers = HandlerRegistry::new();
    handlers.register("await_go", |ctx| async move {
        let got = ctx.recv("go", Duration::from_secs(60)).await?;
        Ok(json!(got))
    });
    let ids = client
        .enqueue_many(vec![
            NewJob::new(QUEUE, "await_go", json!({})),
            NewJob::new(QUEUE, "await_go", json!({})).ordering_key("keyed"),
        ])
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    for &id in &ids {
        common::wait_until(Duration::from_secs(30), "the workflow parks", || async {
            status(&shardq, id).await == JobStatus::Scheduled
        })
        .await;
        let parked = client.job(id).await.unwrap().expect("the job");
        assert!(
            parked.waiting_for.is_some_and(|w| w.contains("topic `go`")),
            "`shardq job show` says it waits for a message on `go`"
        );
    }
    for (n, &id) in ids.iter().enumerate() {
        let sent = Instant::now();
        client.send(id, "go", json!({"n": n}), None).await.unwrap();
        let outcome = client.result(id, Duration::from_secs(20)).await;
        let took = sent.elapsed();
        assert_eq!(outcome.unwrap(), JobOutcome::Succeeded(json!({"n": n})));
        assert!(
            took < Duration::from_secs(20),
            "woken by the send, not the deadline: {took:?}"
        );
        eprintln!("job {n}: received {took:?} after the send");
    }
    stop.cancel();
    worker.await.unwrap();
}

/// What a recv returned: a value, or its error's name.
type Seen = Result<Option<Value>, String>;

/// With no message, a recv of 1 s parks the workflow (`scheduled`), and
/// run again after the deadline it returns `None`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recv_with_no_message_returns_none_after_its_deadline() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let calls: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let mut handlers = HandlerRegistry::new();
    let seen = calls.clone();
    handlers.register("lonely", move |ctx| {
        let seen = seen.clone();
        async move {
            let got = ctx.recv("never", Duration::from_secs(1)).await;
            seen.lock().unwrap().push(match &got {
                Ok(v) => Ok(v.clone()),
                Err(StepError::Waiting(..)) => Err("waiting".to_string()),
                Err(e) => Err(e.to_string()),
            });
            Ok(json!(got?))
        }
    });
    let id = client
        .enqueue(NewJob::new(QUEUE, "lonely", json!({})))
        .await
        .unwrap();
    let started = Instant::now();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    common::wait_until(Duration::from_secs(30), "the workflow parks", || async {
        status(&shardq, id).await == JobStatus::Scheduled
    })
    .await;
    let outcome = client.result(id, Duration::from_secs(30)).await.unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(Value::Null));
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(
        *calls.lock().unwrap(),
        vec![Err("waiting".to_string()), Ok(None)],
        "parked once, then timed out"
    );
}

/// The same idempotency key twice stores one message; a `ctx.send` whose
/// workflow fails after it and is retried stores one message (the first
/// attempt's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_sends_deliver_once() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let target = client
        .enqueue(NewJob::new(IDLE, "never_runs", json!({})))
        .await
        .unwrap();
    for _ in 0..2 {
        client
            .send(target, "t", json!("once"), Some("key-1"))
            .await
            .unwrap();
    }
    assert_eq!(
        mailbox(&shardq, target).await,
        vec![("t".to_string(), json!("once"), None)]
    );

    let replayed = client
        .enqueue(NewJob::new(IDLE, "never_runs", json!({})))
        .await
        .unwrap();
    let unrecorded = client
        .enqueue(NewJob::new(IDLE, "never_runs", json!({})))
        .await
        .unwrap();
    let mut handlers = HandlerRegistry::new();
    handlers.register("sender", move |ctx| async move {
        ctx.send(replayed, "from_sender", json!(ctx.attempt))
            .await?;
        if ctx.attempt == 1 {
            return Err("failed after sending".into());
        }
        Ok(Value::Null)
    });
    // The crash window: the message is stored but its step is not recorded
    // (removed here, as if the worker died between the two): the retry
    // sends again, under the same derived key.
    let shard = shardq.shards().get(0).clone();
    handlers.register("forgetful", move |ctx| {
        let shard = shard.clone();
        async move {
            ctx.send(unrecorded, "from_sender", json!(ctx.attempt))
                .await?;
            if ctx.attempt == 1 {
                shard
                    .client()
                    .await?
                    .execute(
                        "DELETE FROM workflow_steps WHERE shard_key = $1 \
                         AND workflow_id = $2 AND step_name = 'shardq:send:1'",
                        &[&ctx.id.shard_key, &ctx.id.id],
                    )
                    .await?;
                return Err("failed after sending, its step lost".into());
            }
            Ok(Value::Null)
        }
    });
    let senders = client
        .enqueue_many(vec![
            NewJob::new(QUEUE, "sender", json!({})),
            NewJob::new(QUEUE, "forgetful", json!({})),
        ])
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    for &sender in &senders {
        let outcome = client.result(sender, Duration::from_secs(30)).await;
        assert_eq!(outcome.unwrap(), JobOutcome::Succeeded(Value::Null));
    }
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(
        mailbox(&shardq, replayed).await,
        vec![("from_sender".to_string(), json!(1), None)],
        "the retry's replay sent nothing"
    );
    assert_eq!(
        mailbox(&shardq, unrecorded).await,
        vec![("from_sender".to_string(), json!(1), None)],
        "the retry sent again under the same key: stored once"
    );
}

/// A send sent again under its key after its workflow finished (the first
/// one committed, its reply lost or its call left in flight to a frozen
/// shard) is a duplicate, not a refusal: from the Rust client and from SQL.
/// A new key is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_repeated_after_its_workflow_finished_is_a_duplicate() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let target = client
        .enqueue(NewJob::new(IDLE, "never_runs", json!({})))
        .await
        .unwrap();
    client
        .send(target, "t", json!("once"), Some("key-1"))
        .await
        .unwrap();
    let db = shardq.shards().get(0).client().await.unwrap();
    db.execute(
        "UPDATE workflow_status SET status = 'succeeded', finished_at = now() \
         WHERE shard_key = $1 AND id = $2",
        &[&target.shard_key, &target.id],
    )
    .await
    .unwrap();
    client
        .send(target, "t", json!("once"), Some("key-1"))
        .await
        .expect("a duplicate, not a refusal");
    let from_sql = db
        .query_one(
            "SELECT written FROM shardq_send($1, $2, 't', '\"once\"', 'key-1')",
            &[&target.shard_key, &target.id],
        )
        .await
        .expect("a duplicate from SQL too");
    assert!(!from_sql.get::<_, bool>(0));
    let refused = client.send(target, "t", json!("new"), Some("key-2")).await;
    assert!(
        matches!(
            refused,
            Err(ClientError::SendRefused {
                status: Some(JobStatus::Succeeded),
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(
        mailbox(&shardq, target).await,
        vec![("t".to_string(), json!("once"), None)]
    );
}

/// A send to a workflow that does not exist, or has finished, is refused
/// with an error that names it and its state; nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_to_a_missing_or_finished_workflow_is_refused() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let missing = JobId {
        shard_key: 5,
        id: 987_654,
    };
    let err = client
        .send(missing, "t", json!(1), None)
        .await
        .expect_err("no such workflow");
    assert!(
        matches!(err, ClientError::SendRefused { to, status: None } if to == missing),
        "{err:?}"
    );
    assert!(err.to_string().contains("5-987654"), "{err}");
    assert!(err.to_string().contains("no such workflow"), "{err}");

    let mut handlers = HandlerRegistry::new();
    handlers.register("quick", |_ctx| async { Ok(Value::Null) });
    let done = client
        .enqueue(NewJob::new(QUEUE, "quick", json!({})))
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    client.result(done, Duration::from_secs(30)).await.unwrap();
    stop.cancel();
    worker.await.unwrap();
    let cancelled = client
        .enqueue(NewJob::new(IDLE, "never_runs", json!({})))
        .await
        .unwrap();
    client.cancel(cancelled).await.unwrap();
    for (id, state) in [
        (done, JobStatus::Succeeded),
        (cancelled, JobStatus::Cancelled),
    ] {
        let err = client
            .send(id, "t", json!(1), Some("k"))
            .await
            .expect_err("a finished workflow");
        assert!(
            matches!(err, ClientError::SendRefused { to, status: Some(s) } if to == id && s == state),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains(&id.to_string()) && text.contains(state.as_str()),
            "{text}"
        );
    }
    assert_eq!(all_messages(&shardq).await, 0, "nothing stored");
}

/// A message that cannot be stored as it is is refused before any shard is
/// asked, saying what is wrong: an empty, NUL-holding or oversized topic, an
/// oversized idempotency key, a payload over `limits.max_payload_bytes`;
/// nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_message_is_refused_before_anything_is_stored() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let to = client
        .enqueue(NewJob::new(IDLE, "never_runs", json!({})))
        .await
        .unwrap();
    let long = "x".repeat(2_000);
    let big = json!("y".repeat(2_000_000));
    let cases: [(&str, Value, Option<&str>, &str); 5] = [
        ("", json!(1), None, "topic name is empty"),
        ("a\0b", json!(1), None, "topic contains a NUL"),
        (&long, json!(1), None, "topic is 2000 bytes"),
        ("t", json!(1), Some(&long), "idempotency key is 2000 bytes"),
        ("t", big, None, "over limits.max_payload_bytes"),
    ];
    for (topic, message, key, says) in cases {
        let err = client
            .send(to, topic, message, key)
            .await
            .expect_err("an invalid message");
        assert!(
            matches!(err, ClientError::InvalidMessage { to: t, .. } if t == to),
            "{err:?}"
        );
        assert!(err.to_string().contains(says), "{err}");
    }
    assert_eq!(all_messages(&shardq).await, 0, "nothing stored");
}

/// A running workflow, claimed (by hand) by owner `racer` with fence 7.
async fn running_workflow(shardq: &Shardq) -> JobId {
    let id = shardq
        .client()
        .enqueue(NewJob::new(IDLE, "never_runs", json!({})))
        .await
        .unwrap();
    shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET status = 'running', owner = 'racer', fence = 7, \
                attempts = 1, started_at = now(), lease_expires_at = now() + interval '1 hour' \
             WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap();
    id
}

fn recv<'a>(id: JobId, name: &'a str, topic: &'a str) -> Recv<'a> {
    Recv {
        id,
        name,
        topic,
        timeout: Duration::ZERO,
        owner: "racer",
        fence: 7,
    }
}

/// A recv's first statement in `tx`: locks the workflow's row as claim
/// (`racer`, 7); returns whether that claim holds it.
async fn recv_lock(tx: &tokio_postgres::Transaction<'_>, key: (i32, i64)) -> bool {
    let (owner, fence) = ("racer", 7_i64);
    tx.query_typed_one(
        sql::MESSAGE_RECV_LOCK,
        &[
            (&key.0, Type::INT4),
            (&key.1, Type::INT8),
            (&owner, Type::TEXT),
            (&fence, Type::INT8),
        ],
    )
    .await
    .unwrap()
    .get("owned")
}

/// A recv's second statement in `tx`: step `name` of `topic`, waiting
/// `micros` at most; returns the step's output (or the wait's).
async fn recv_take(
    tx: &tokio_postgres::Transaction<'_>,
    key: (i32, i64),
    name: &str,
    topic: &str,
    micros: i64,
) -> Value {
    tx.query_typed_one(
        sql::MESSAGE_RECV_TAKE,
        &[
            (&key.0, Type::INT4),
            (&key.1, Type::INT8),
            (&name, Type::TEXT),
            (&topic, Type::TEXT),
            (&micros, Type::INT8),
        ],
    )
    .await
    .unwrap()
    .get("output")
}

/// A recv whose deadline has passed and a send that race, driven statement
/// by statement. The recv locks first: the send waits for it, the recv
/// (seeing no message) records its timeout, and the message, committed
/// after, stays in the mailbox for the next recv of the topic. The send
/// locks and writes first: the recv waits for it, and once the send
/// commits it takes the message (its look is a statement after its lock),
/// even though its deadline has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_racing_a_message_is_decided_under_the_row_lock() {
    let (_shards, shardq) = shardq().await;
    let id = running_workflow(&shardq).await;
    let shard = shardq.shards().get(0).clone();
    let key = (id.shard_key, id.id);

    // The recv decides first.
    let mut db = shard.client().await.unwrap();
    let tx = db.transaction().await.unwrap();
    assert!(recv_lock(&tx, key).await);
    let client = shardq.client();
    let send = tokio::spawn(async move { client.send(id, "t", json!("late"), None).await });
    common::until_lock_wait(shardq.shards().get(0), "the send waits for the recv's lock").await;
    assert!(!send.is_finished(), "the send waits for the recv's lock");
    let output = recv_take(&tx, key, "shardq:recv:1", "t", 0).await;
    assert_eq!(output["timed_out"], json!(true), "{output}");
    tx.commit().await.unwrap();
    send.await.unwrap().expect("the send, after the recv");
    assert_eq!(
        mailbox(&shardq, id).await,
        vec![("t".to_string(), json!("late"), None)],
        "the message stays in the mailbox"
    );
    assert_eq!(
        messages::recv(&shard, recv(id, "shardq:recv:1", "t"))
            .await
            .unwrap(),
        Received::TimedOut,
        "the timed-out recv keeps its decision"
    );
    assert_eq!(
        messages::recv(&shard, recv(id, "shardq:recv:2", "t"))
            .await
            .unwrap(),
        Received::Message(json!("late")),
        "the next recv of the topic takes it"
    );
    assert_eq!(
        messages::recv(&shard, recv(id, "shardq:recv:3", "t"))
            .await
            .unwrap(),
        Received::TimedOut,
        "taken once"
    );

    // The send writes first: its statement (lock, then write, in
    // shardq_send_row) done, its transaction not committed.
    let tx = db.transaction().await.unwrap();
    let (topic, message, no_key) = ("u", json!("early"), None::<&str>);
    let written = tx
        .query_typed_one(
            sql::MESSAGE_SEND,
            &[
                (&key.0, Type::INT4),
                (&key.1, Type::INT8),
                (&topic, Type::TEXT),
                (&message, Type::JSONB),
                (&no_key, Type::TEXT),
            ],
        )
        .await
        .unwrap();
    assert_eq!(written.get::<_, &str>("status"), "running");
    assert!(written.get::<_, bool>("written"));
    let racing = shard.clone();
    let received =
        tokio::spawn(async move { messages::recv(&racing, recv(id, "shardq:recv:4", "u")).await });
    common::until_lock_wait(shardq.shards().get(0), "the recv waits for the send's lock").await;
    assert!(
        !received.is_finished(),
        "the recv waits for the send's lock"
    );
    tx.commit().await.unwrap();
    assert_eq!(
        received.await.unwrap().unwrap(),
        Received::Message(json!("early")),
        "the send committed first: its message wins over the passed deadline"
    );
    assert_eq!(
        mailbox(&shardq, id).await[1],
        (
            "u".to_string(),
            json!("early"),
            Some("shardq:recv:4".to_string())
        )
    );

    // The recv locks first and records a wait (its deadline a minute
    // away): the send, waiting for the lock, then sees the wait (its look
    // is a statement after its lock) and wakes the workflow.
    let tx = db.transaction().await.unwrap();
    assert!(recv_lock(&tx, key).await);
    let client = shardq.client();
    let send = tokio::spawn(async move { client.send(id, "v", json!("wakes"), None).await });
    common::until_lock_wait(shardq.shards().get(0), "the send waits for the recv's lock").await;
    let output = recv_take(&tx, key, "shardq:recv:5", "v", 60_000_000).await;
    assert!(output.get("message").is_none() && output.get("timed_out").is_none());
    tx.commit().await.unwrap();
    send.await.unwrap().expect("the send, after the recv");
    let woken: bool = db
        .query_one(
            "SELECT run_at <= now() FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(woken, "the send saw the wait and woke the workflow");
    let mut wait = recv(id, "shardq:recv:5", "v");
    wait.timeout = Duration::from_secs(60);
    assert_eq!(
        messages::recv(&shard, wait).await.unwrap(),
        Received::Message(json!("wakes"))
    );
}
