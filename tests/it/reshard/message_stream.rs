//! A stream of messages while the shards grow 2 → 4: recipients keyed over
//! the shards wait on two topics; on one, a sender workflow per recipient
//! sends with `ctx.send` (parking while its recipient is held by the move),
//! on the other the test sends with `Client::send` (again, under the same
//! key, when refused while its recipient is held or when a shard fails),
//! while the move runs and a worker of each list serves the queue. Every
//! recipient receives every message once, each topic in send order, and no
//! message is stored twice on any shard.

use super::{growing_to_four, GrowingToFour};
use serde_json::json;
use shardq::reshard::{reshard, Options, Step};
use shardq::shards::ShardSet;
use shardq::{
    Client, ClientError, Config, HandlerRegistry, JobId, JobOutcome, JobStatus, NewJob, Worker,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const RECIPIENTS: usize = 8;
/// Messages per topic and recipient.
const MESSAGES: u64 = 10;
/// Between two sends of one stream: the streams last about 3 s, across the
/// move's opening.
const GAP: Duration = Duration::from_millis(300);
/// The topic of the sender workflows (`ctx.send`).
const FROM_WORKFLOW: &str = "w";
/// The topic of the test's sends (`Client::send`).
const FROM_CLIENT: &str = "c";

const STREAM_TOML: &str = "
[dequeue]
batch_size = 8
empty_backoff_min_ms = 5
empty_backoff_max_ms = 50
[worker]
queues = [\"moving\"]
concurrency = 24
maintenance_interval_ms = 100
";

/// `recipient` receives [`MESSAGES`] on each topic and returns them;
/// `sender` sends [`MESSAGES`] to its recipient, [`GAP`] apart.
fn registry() -> HandlerRegistry {
    let mut registry = HandlerRegistry::new();
    registry.register("recipient", |ctx| async move {
        let mut got = serde_json::Map::new();
        for topic in [FROM_WORKFLOW, FROM_CLIENT] {
            let mut values = Vec::new();
            for _ in 0..MESSAGES {
                match ctx.recv(topic, Duration::from_secs(120)).await? {
                    Some(v) => values.push(v),
                    None => return Err(format!("no message on {topic}").into()),
                }
            }
            got.insert(topic.to_string(), json!(values));
        }
        Ok(json!(got))
    });
    registry.register("sender", |ctx| async move {
        let to: JobId = ctx.payload["to"].as_str().unwrap_or("").parse()?;
        for k in 0..MESSAGES {
            ctx.send(to, FROM_WORKFLOW, json!(k)).await?;
            tokio::time::sleep(GAP).await;
        }
        Ok(json!("sent"))
    });
    registry
}

fn worker(config: &Config, stop: &CancellationToken) -> tokio::task::JoinHandle<()> {
    let (config, stop) = (config.clone(), stop.clone());
    tokio::spawn(async move {
        let shards = ShardSet::connect(&config).unwrap();
        Worker::new(config, shards, registry()).run(stop).await;
    })
}

/// Sends [`MESSAGES`] on [`FROM_CLIENT`] to `to`, [`GAP`] apart, each under
/// a key of its own and sent again until stored; counts the sends made
/// after `opened` was set.
async fn client_stream(client: Client, to: JobId, r: usize, after_open: Arc<AtomicU32>) {
    for k in 0..MESSAGES {
        let key = format!("c-{r}-{k}");
        loop {
            match client.send(to, FROM_CLIENT, json!(k), Some(&key)).await {
                Ok(()) => break,
                Err(ClientError::SendRefused {
                    status: Some(JobStatus::Held),
                    ..
                })
                | Err(ClientError::Shard(_)) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => panic!("send {key}: {e}"),
            }
        }
        after_open.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(GAP).await;
    }
}

/// Per recipient, over every shard: the messages stored (not held copies).
async fn stored(all: &ShardSet) -> HashMap<(i32, i64), usize> {
    let mut per = HashMap::new();
    for shard in all.all() {
        for r in shard
            .client()
            .await
            .unwrap()
            .query(
                "SELECT m.shard_key, m.workflow_id, count(*) FROM workflow_messages m \
                 GROUP BY 1, 2",
                &[],
            )
            .await
            .unwrap()
        {
            *per.entry((r.get(0), r.get(1))).or_default() += r.get::<_, i64>(2) as usize;
        }
    }
    per
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_messages_arrives_once_and_in_order_while_two_grow_to_four() {
    let GrowingToFour {
        servers: _servers,
        old,
        new,
        all,
    } = growing_to_four(STREAM_TOML).await;
    let client = Client::new(&new).unwrap();
    let mut recipients = Vec::new();
    for r in 0..RECIPIENTS {
        let job = NewJob::new("moving", "recipient", json!({})).ordering_key(format!("inbox-{r}"));
        recipients.push(client.enqueue(job).await.unwrap());
    }
    let mut senders = Vec::new();
    for (r, to) in recipients.iter().enumerate() {
        let job = NewJob::new("moving", "sender", json!({ "to": to.to_string() }))
            .ordering_key(format!("sender-{r}"));
        senders.push(client.enqueue(job).await.unwrap());
    }
    let old_stop = CancellationToken::new();
    let old_worker = worker(&old, &old_stop);
    let after_open = Arc::new(AtomicU32::new(0));
    let streams: Vec<_> = recipients
        .iter()
        .enumerate()
        .map(|(r, &to)| tokio::spawn(client_stream(client.clone(), to, r, after_open.clone())))
        .collect();

    tokio::time::sleep(Duration::from_millis(600)).await;
    let stopped = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    let opened = reshard(&all, 2, 4, &stopped, |_| {}).await.expect("open");
    assert!(!opened.complete && opened.ranges > 0);
    let sent_before_open = after_open.load(Ordering::SeqCst);
    let new_stop = CancellationToken::new();
    let new_worker = worker(&new, &new_stop);
    let summary = reshard(&all, 2, 4, &Options::default(), |_| {})
        .await
        .expect("the move finishes");
    assert!(summary.complete, "{summary:?}");
    old_stop.cancel();
    old_worker.await.unwrap();
    for stream in streams {
        stream.await.unwrap();
    }
    let total = RECIPIENTS as u32 * MESSAGES as u32;
    assert!(
        sent_before_open < total,
        "the stream went on after the move opened: {sent_before_open} of {total} sent before"
    );

    let in_order: Vec<u64> = (0..MESSAGES).collect();
    for (r, &to) in recipients.iter().enumerate() {
        let outcome = client.result(to, Duration::from_secs(120)).await.unwrap();
        let expected = json!({ FROM_WORKFLOW: in_order, FROM_CLIENT: in_order });
        assert_eq!(outcome, JobOutcome::Succeeded(expected), "recipient {r}");
    }
    for (r, &sender) in senders.iter().enumerate() {
        let outcome = client
            .result(sender, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(outcome, JobOutcome::Succeeded(json!("sent")), "sender {r}");
    }
    new_stop.cancel();
    new_worker.await.unwrap();
    let per = stored(&all).await;
    for (r, to) in recipients.iter().enumerate() {
        let count = per.get(&(to.shard_key, to.id)).copied().unwrap_or(0);
        assert_eq!(
            count,
            2 * MESSAGES as usize,
            "recipient {r}: stored once each"
        );
    }
}
