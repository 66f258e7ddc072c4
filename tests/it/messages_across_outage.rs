//! A workflow that sends to a workflow whose shard does not answer: the
//! sender parks and sends again within seconds, spending no attempt (with
//! one attempt it would otherwise end dead), and once the shard is back
//! the message is stored there once. Senders to a frozen shard, which this
//! worker's claims found silent, park at once instead of holding their
//! slots until the statement deadline: a send to a healthy shard still
//! gets a slot. A long outage parks them longer, up to 30 s.

use crate::common;

use super::children_across::key_on;
use super::children_across_outage::{parked_due_soon, two_slots};
use common::TestShards;
use serde_json::json;
use shardq::{HandlerRegistry, JobId, JobOutcome, NewJob};
use shardq_local::StopMode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "senders";
/// A queue no worker serves: the recipient stays queued, its mailbox open.
const IDLE: &str = "idle";

/// Two shards with short deadlines and a worker of the senders' queue; a
/// key on shard 0 for a sender, and a recipient on shard 1 that stays
/// queued (no worker serves its queue).
async fn sender_and_recipient_shards() -> (TestShards, shardq::Shardq, String, JobId) {
    let (shards, shardq) = two_slots(QUEUE, 2, 1000, 3000).await;
    let (home, away) = (key_on(&shardq, 0), key_on(&shardq, 1));
    let recipient = shardq
        .client()
        .enqueue(NewJob::new(IDLE, "recipient", json!({})).ordering_key(away))
        .await
        .unwrap();
    (shards, shardq, home, recipient)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_parks_while_the_recipients_shard_is_down_and_spends_no_attempt() {
    let (shards, shardq, home, recipient) = sender_and_recipient_shards().await;
    let client = shardq.client();
    let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let runs = Arc::new(AtomicU32::new(0));
    let mut handlers = HandlerRegistry::new();
    let (told, wait, counted) = (started.clone(), go.clone(), runs.clone());
    handlers.register("sender", move |ctx| {
        let (told, wait, counted) = (told.clone(), wait.clone(), counted.clone());
        async move {
            if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                told.notify_one();
                wait.notified().await;
            }
            ctx.send(recipient, "news", json!({ "n": 1 })).await?;
            Ok(json!("sent"))
        }
    });
    let sender = client
        .enqueue(
            NewJob::new(QUEUE, "sender", json!({}))
                .ordering_key(home)
                .max_attempts(1),
        )
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    started.notified().await;
    shards.servers[1].stop(StopMode::Immediate).unwrap();
    go.notify_one();

    // Parked (no attempt spent), due again within seconds.
    parked_due_soon(shardq.shards().get(0), sender, "the sender").await;

    shards.servers[1].start_again().unwrap();
    let outcome = client
        .result(sender, Duration::from_secs(60))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(json!("sent")));
    assert!(runs.load(Ordering::SeqCst) >= 2, "the sender ran again");
    assert_eq!(
        mailbox(&shards, 1, recipient).await,
        vec![json!({ "n": 1 })]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn senders_to_a_frozen_shard_park_at_once_and_leave_the_slots_to_others() {
    use nix::sys::signal::Signal;
    let (shards, shardq) = two_slots(QUEUE, 3, 120000, 120000).await;
    let client = shardq.client();
    let recipient =
        |index| NewJob::new(IDLE, "recipient", json!({})).ordering_key(key_on(&shardq, index));
    let cold = client.enqueue(recipient(1)).await.unwrap();
    let warm = client.enqueue(recipient(2)).await.unwrap();
    let mut handlers = HandlerRegistry::new();
    handlers.register("sender", |ctx| async move {
        let to: JobId = ctx.payload["to"].as_str().unwrap().parse().unwrap();
        ctx.send(to, "news", json!(ctx.payload["n"])).await?;
        Ok(json!("sent"))
    });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    let frozen = shards.servers[1].server();
    frozen.signal_all(Signal::SIGSTOP).expect("SIGSTOP");
    // The worker's claims there go unanswered within their budget.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let sender = |to: JobId, n: usize| {
        let payload = json!({ "to": to.to_string(), "n": n });
        NewJob::new(QUEUE, "sender", payload)
            .ordering_key(super::children_across::nth_key_on(&shardq, 0, n))
    };
    let mut to_cold = Vec::new();
    for n in 0..4 {
        to_cold.push(client.enqueue(sender(cold, n)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let to_warm = client.enqueue(sender(warm, 4)).await.unwrap();
    let healthy = client.result(to_warm, Duration::from_secs(20)).await;
    frozen.signal_all(Signal::SIGCONT).expect("SIGCONT");
    assert_eq!(
        healthy.unwrap(),
        JobOutcome::Succeeded(json!("sent")),
        "a send to a healthy shard gets a slot while the frozen shard's senders park"
    );
    for id in to_cold {
        let outcome = client.result(id, Duration::from_secs(60)).await.unwrap();
        assert_eq!(outcome, JobOutcome::Succeeded(json!("sent")));
    }
    stop.cancel();
    worker.await.unwrap();
    let mut got = mailbox(&shards, 1, cold).await;
    got.sort_by_key(|v| v.as_u64());
    assert_eq!(
        got,
        vec![json!(0), json!(1), json!(2), json!(3)],
        "each once"
    );
}

/// A sender parked by a long outage of the recipient's shard tries again
/// less often: after about 24 s of the shard down (as this worker's claims
/// there found it), the park is about half that, not 5 s; once the shard
/// is back the message lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_parked_by_a_long_outage_tries_again_less_often() {
    let (shards, shardq, home, recipient) = sender_and_recipient_shards().await;
    let client = shardq.client();
    let mut handlers = HandlerRegistry::new();
    handlers.register("sender", move |ctx| async move {
        ctx.send(recipient, "news", json!({ "n": 1 })).await?;
        Ok(json!("sent"))
    });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    shards.servers[1].stop(StopMode::Immediate).unwrap();
    tokio::time::sleep(Duration::from_secs(24)).await;

    let sender = client
        .enqueue(NewJob::new(QUEUE, "sender", json!({})).ordering_key(home))
        .await
        .unwrap();
    let db = shardq.shards().get(0).client().await.unwrap();
    let parked_for = || async {
        let row = db
            .query_one(
                "SELECT status = 'scheduled' AND parked, \
                        extract(epoch FROM run_at - now())::float8 \
                 FROM workflow_status WHERE shard_key = $1 AND id = $2",
                &[&sender.shard_key, &sender.id],
            )
            .await
            .unwrap();
        row.get::<_, bool>(0).then(|| row.get::<_, f64>(1))
    };
    common::wait_until(Duration::from_secs(20), "the sender parked", || async {
        parked_for().await.is_some()
    })
    .await;
    let ahead = parked_for().await.expect("parked");
    assert!(
        ahead > 7.0,
        "parked {ahead:.1} s after 24 s of outage: no longer than at its start (5 s)"
    );

    shards.servers[1].start_again().unwrap();
    let outcome = client
        .result(sender, Duration::from_secs(90))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(json!("sent")));
    assert_eq!(
        mailbox(&shards, 1, recipient).await,
        vec![json!({ "n": 1 })]
    );
}

/// The messages in `to`'s mailbox on shard `index`, in order.
async fn mailbox(shards: &TestShards, index: usize, to: JobId) -> Vec<serde_json::Value> {
    let (db, connection) = tokio_postgres::connect(&shards.urls[index], tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    db.query(
        "SELECT message FROM workflow_messages WHERE shard_key = $1 AND workflow_id = $2 \
         ORDER BY seq",
        &[&to.shard_key, &to.id],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}
