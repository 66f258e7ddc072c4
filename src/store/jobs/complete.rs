//! Writing many outcomes at once, fenced.

use super::super::exec::{self, under_key_locks};
use super::super::sql::{self, Param};
use crate::config::Backoff;
use crate::job::{Completion, Outcome};
use crate::shards::{Shard, ShardError};
use serde_json::Value;
use tokio_postgres::types::Type;

/// One batch of outcomes, all of jobs of one shard claimed by `owner`.
#[derive(Debug, Clone, Copy)]
pub struct CompleteMany<'a> {
    /// The claiming process (the fence's first half; each completion carries
    /// its claim's fence).
    pub owner: &'a str,
    /// Backoff of failed jobs that have attempts left.
    pub retry: Backoff,
    /// The outcomes.
    pub done: &'a [Completion],
}

/// How a batch of completions landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Written {
    /// Rows written as succeeded.
    pub succeeded: u64,
    /// Failed rows scheduled for another attempt.
    pub retrying: u64,
    /// Failed rows on their last attempt.
    pub dead: u64,
    /// Rows whose cancellation was asked.
    pub cancelled: u64,
    /// Unstarted rows given back.
    pub released: u64,
    /// Of the rows above, those an earlier try of the same write had written
    /// already (its reply was lost, say to a deadline): not written again,
    /// not fenced, counted by the outcome that try wrote.
    pub already: u64,
    /// Completions rejected by the fence (lease lost, job re-claimed).
    pub fenced: u64,
}

impl Written {
    /// Rows written now or before (all but the fenced ones).
    pub fn total(&self) -> u64 {
        self.succeeded + self.retrying + self.dead + self.cancelled + self.released
    }
}

/// Writes `p.done` in one fenced statement ([`sql::JOB_COMPLETE_MANY`]).
/// When some of them have ordering keys, the statement runs in a transaction
/// between taking their key locks and releasing the keys that are free
/// afterwards.
///
/// # Errors
///
/// [`ShardError`] when the write fails; nothing was written then. Classify
/// with [`ShardError::kind`].
///
/// # Cancel safety
///
/// Dropping the future may leave the batch written or not; writing it again
/// is safe (the repeat counts as [`Written::already`]).
pub async fn complete_many(shard: &Shard, p: CompleteMany<'_>) -> Result<Written, ShardError> {
    let done = p.done;
    let keys: Vec<i32> = done.iter().map(|c| c.id.shard_key).collect();
    let ids: Vec<i64> = done.iter().map(|c| c.id.id).collect();
    let fences: Vec<i64> = done.iter().map(|c| c.fence).collect();
    let mut statuses = Vec::with_capacity(done.len());
    let mut outputs: Vec<Option<&Value>> = Vec::with_capacity(done.len());
    let mut errors: Vec<Option<&str>> = Vec::with_capacity(done.len());
    for c in done {
        let (status, output, error) = match &c.outcome {
            Outcome::Succeeded(v) => ("succeeded", Some(v), None),
            Outcome::Failed(msg) => ("failed", None, Some(msg.as_str())),
            Outcome::Dead(msg) => ("dead", None, Some(msg.as_str())),
            Outcome::Released => ("released", None, None),
            Outcome::Parked => ("parked", None, None),
        };
        statuses.push(status);
        outputs.push(output);
        errors.push(error);
    }
    let (min_ms, max_ms) = (
        p.retry.min.as_millis() as f64,
        p.retry.max.as_millis() as f64,
    );
    let params: [Param; 9] = [
        (&keys, Type::INT4_ARRAY),
        (&ids, Type::INT8_ARRAY),
        (&fences, Type::INT8_ARRAY),
        (&statuses, Type::TEXT_ARRAY),
        (&outputs, Type::JSONB_ARRAY),
        (&p.owner, Type::TEXT),
        (&errors, Type::TEXT_ARRAY),
        (&min_ms, Type::FLOAT8),
        (&max_ms, Type::FLOAT8),
    ];
    let row = if done.iter().any(Completion::keyed) {
        under_key_locks(shard, &keys, &ids, sql::JOB_COMPLETE_MANY, &params)
            .await?
            .pop()
            .expect("one count row")
    } else {
        exec::query_one(shard, sql::JOB_COMPLETE_MANY, &params).await?
    };
    let count = |column: &str| row.get::<_, i64>(column) as u64;
    let mut written = Written {
        succeeded: count("succeeded"),
        retrying: count("retrying"),
        dead: count("dead"),
        cancelled: count("cancelled"),
        released: count("released"),
        already: count("already"),
        fenced: 0,
    };
    written.fenced = done.len() as u64 - written.total();
    Ok(written)
}
