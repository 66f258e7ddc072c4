//! The driver of the waiting workflows' mailboxes: for each workflow whose
//! enqueue was acknowledged, sends the messages of every topic
//! ([`waits::TOPICS`]) with `Client::send`, one topic's messages in order,
//! each under an idempotency key (a send that failed or timed out is sent
//! again until it is stored or refused), and keeps what each send ended as.

use super::waits::{self, TOPICS};
use shardq::{Client, ClientError, JobId};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A send that gets no answer within this is sent again (same key).
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause before sending again after a failure.
const RESEND_PAUSE: Duration = Duration::from_millis(200);

/// What one send ended as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Stored (the client said so).
    Stored,
    /// Refused: the workflow had finished (or did not exist).
    Refused,
    /// Still failing at the deadline: stored or not.
    Unsure,
}

/// One message the driver sent.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The workflow's job number.
    pub n: u64,
    /// Its topic.
    pub topic: &'static str,
    /// Its place among the topic's messages, from 0 (the send order).
    pub k: usize,
    /// What the send ended as.
    pub outcome: Outcome,
}

/// The idempotency key of message `k` of `topic` to workflow `n`; the checks
/// read the message back by it.
pub fn key(n: u64, topic: &str, k: usize) -> String {
    format!("{n}:{topic}:{k}")
}

/// Sends the messages of every workflow announced on `acked` (its number
/// and id, once its enqueue was acknowledged) until the channel closes and
/// every workflow's sends are over; gives up sends still failing at
/// `deadline`. Returns every send.
pub async fn run(
    client: Client,
    mut acked: mpsc::UnboundedReceiver<(u64, JobId)>,
    deadline: Instant,
) -> Vec<Sent> {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    while let Some((n, id)) = acked.recv().await {
        let (client, sent) = (client.clone(), sent.clone());
        let announced = Instant::now();
        tasks.spawn(async move {
            let mut plan: Vec<_> = TOPICS.iter().map(|t| ((t.delay)(n), t)).collect();
            plan.sort_by_key(|(delay, _)| *delay);
            for (delay, topic) in plan {
                tokio::time::sleep_until((announced + delay).into()).await;
                for k in 0..topic.messages {
                    let outcome = send(&client, id, n, topic.name, k, deadline).await;
                    let record = Sent {
                        n,
                        topic: topic.name,
                        k,
                        outcome,
                    };
                    sent.lock().expect("sends").push(record);
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let sent = sent.lock().expect("sends").clone();
    sent
}

/// Sends message `k` of `topic` to workflow `n` until stored or refused, or
/// `deadline`.
async fn send(
    client: &Client,
    id: JobId,
    n: u64,
    topic: &'static str,
    k: usize,
    deadline: Instant,
) -> Outcome {
    let key = key(n, topic, k);
    let message = serde_json::json!({ "n": n, "topic": topic, "k": k });
    loop {
        let sending = client.send(id, topic, message.clone(), Some(&key));
        match tokio::time::timeout(SEND_TIMEOUT, sending).await {
            Ok(Ok(())) => return Outcome::Stored,
            Ok(Err(ClientError::SendRefused { .. })) => return Outcome::Refused,
            Ok(Err(err)) => {
                tracing::debug!(n, topic, k, error = %shardq::error_chain(&err), "send failed");
            }
            Err(_) => tracing::debug!(n, topic, k, "send timed out"),
        }
        if Instant::now() >= deadline {
            return Outcome::Unsure;
        }
        tokio::time::sleep(RESEND_PAUSE).await;
    }
}

/// Whether job `n` gets messages (it is a waiting workflow).
pub fn wanted(n: u64) -> bool {
    waits::is_waiting(n)
}
