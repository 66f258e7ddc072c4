//! Messages to a workflow: sending to its mailbox, and the recv steps that
//! take from it (`shardq_send_row` and [`sql::MESSAGE_RECV_LOCK`] say how
//! the two are ordered).

use super::exec;
use super::sql;
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use crate::store::JobStatus;
use serde_json::Value;
use std::time::{Duration, SystemTime};
use tokio_postgres::types::Type;

/// A message to send.
#[derive(Debug, Clone, Copy)]
pub struct SendMessage<'a> {
    /// The workflow (job) it goes to.
    pub to: JobId,
    /// Its topic.
    pub topic: &'a str,
    /// The message.
    pub message: &'a Value,
    /// A key that makes the send exactly once: a send with a key used
    /// before for this workflow writes nothing.
    pub idempotency_key: Option<&'a str>,
}

/// What a send did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Written; `woken` when a recv of the workflow waited on its topic.
    Written {
        /// Whether the send woke the workflow.
        woken: bool,
    },
    /// Its idempotency key was used before (also when the workflow has
    /// finished or started moving since): nothing written.
    Duplicate,
    /// The workflow cannot take messages: it has finished, or is moving
    /// between shards (`held`), and no message of the send's idempotency
    /// key is in its mailbox. Nothing written.
    Refused(JobStatus),
    /// This shard has no such workflow. Nothing written.
    Missing,
}

/// Sends a message to a workflow on `shard`, in one statement
/// ([`sql::MESSAGE_SEND`]): under its row's lock, then written and the
/// workflow woken in a later statement of `shardq_send_row`, one
/// transaction.
///
/// # Errors
///
/// [`ShardError`] when the shard fails; nothing is written then, unless
/// the commit's reply was lost (a send again with the same idempotency key
/// writes nothing twice).
///
/// # Cancel safety
///
/// As the errors: with an idempotency key, sending again is harmless.
pub async fn send(shard: &Shard, p: SendMessage<'_>) -> Result<Sent, ShardError> {
    let row = exec::query_one(
        shard,
        sql::MESSAGE_SEND,
        &[
            (&p.to.shard_key, Type::INT4),
            (&p.to.id, Type::INT8),
            (&p.topic, Type::TEXT),
            (p.message, Type::JSONB),
            (&p.idempotency_key, Type::TEXT),
        ],
    )
    .await?;
    let status = row
        .get::<_, Option<&str>>("status")
        .map(JobStatus::from_column);
    Ok(match status {
        None => Sent::Missing,
        Some(
            JobStatus::Waiting | JobStatus::Scheduled | JobStatus::Queued | JobStatus::Running,
        ) => match row.get::<_, bool>("written") {
            true => Sent::Written {
                woken: row.get("woken"),
            },
            false => Sent::Duplicate,
        },
        Some(status) => match p.idempotency_key {
            Some(key) if key_used(shard, p.to, key).await? => Sent::Duplicate,
            _ => Sent::Refused(status),
        },
    })
}

/// Whether `to`'s mailbox on `shard` holds a message sent under `key`
/// ([`sql::MESSAGE_KEY_USED`]): a send refused because its workflow
/// finished or started moving may repeat one that committed before (its
/// reply lost, or the call left in flight to a silent shard), and is a
/// duplicate, not a refusal. Messages leave only with their workflow's
/// row (a move copies them first, keys and all), so nothing in between
/// can make the answer wrong.
async fn key_used(shard: &Shard, to: JobId, key: &str) -> Result<bool, ShardError> {
    let row = exec::query_one(
        shard,
        sql::MESSAGE_KEY_USED,
        &[
            (&to.shard_key, Type::INT4),
            (&to.id, Type::INT8),
            (&key, Type::TEXT),
        ],
    )
    .await?;
    Ok(row.get(0))
}

/// A recv step of a workflow.
#[derive(Debug, Clone, Copy)]
pub struct Recv<'a> {
    /// The workflow (job).
    pub id: JobId,
    /// The step's name.
    pub name: &'a str,
    /// The topic it receives.
    pub topic: &'a str,
    /// How long it waits for a message, from the first call, by the
    /// shard's clock.
    pub timeout: Duration,
    /// The worker holding the workflow.
    pub owner: &'a str,
    /// The fence of its claim.
    pub fence: i64,
}

/// Where a recv step stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    /// It took this message (now or on an earlier run).
    Message(Value),
    /// No message came before its deadline.
    TimedOut,
    /// No message yet: the workflow is to park until this deadline (its
    /// `run_at` is set; a send of the topic wakes it sooner).
    Waiting(SystemTime),
    /// The workflow's cancellation was asked.
    Cancelled,
    /// This claim no longer holds the workflow (its lease was lost).
    NotHeld,
}

/// Decides recv step `name` once, in one round trip
/// ([`sql::MESSAGE_RECV`]): under the workflow's row lock
/// ([`sql::MESSAGE_RECV_LOCK`]), then in a later statement
/// ([`sql::MESSAGE_RECV_TAKE`]) that sees every message committed before
/// the lock was granted; a step decided before returns what it decided.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe in effect: a message taken is recorded in the same
/// transaction, and the next call returns it.
pub async fn recv(shard: &Shard, p: Recv<'_>) -> Result<Received, ShardError> {
    let micros = i64::try_from(p.timeout.as_micros()).unwrap_or(i64::MAX);
    let row = exec::query_one(
        shard,
        sql::MESSAGE_RECV,
        &[
            (&p.id.shard_key, Type::INT4),
            (&p.id.id, Type::INT8),
            (&p.owner, Type::TEXT),
            (&p.fence, Type::INT8),
            (&p.name, Type::TEXT),
            (&p.topic, Type::TEXT),
            (&micros, Type::INT8),
        ],
    )
    .await?;
    if row.get::<_, bool>("cancel_requested") {
        return Ok(Received::Cancelled);
    }
    match row.get::<_, Option<Value>>("output") {
        Some(output) if row.get::<_, bool>("owned") => Ok(decision(&output)),
        _ => Ok(Received::NotHeld),
    }
}

/// What a recv step's recorded output says.
fn decision(output: &Value) -> Received {
    if let Some(message) = output.get("message") {
        return Received::Message(message.clone());
    }
    if output.get("timed_out").is_some() {
        return Received::TimedOut;
    }
    let deadline = output
        .get("deadline")
        .and_then(Value::as_str)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map_or(SystemTime::UNIX_EPOCH, SystemTime::from);
    Received::Waiting(deadline)
}
