//! The database side of taking jobs: gated or ungated claims, fenced batched
//! completions, and lease recovery. Each function is one statement on one shard.
//!
//! Lock keys: the dequeue slots of queue `q` are the advisory locks
//! `(dequeue_lock_key(q), slot)` for `slot` in `0..K`, where the first key is
//! the low 32 bits of FNV-1a-64 of `"shardq:dequeue:" + q`. Lease recovery uses
//! `(maintenance_lock_key(), 0)`, promotion of due jobs slot 1, retention
//! slot 2. All are transaction-level locks.

use crate::config::{Backoff, DequeueMode};
use crate::job::{ClaimedJob, Completion, JobId, Outcome};
use crate::router::fnv1a64;
use crate::shards::{Shard, ShardError};
use crate::sql;
use serde_json::Value;
use std::sync::OnceLock;
use std::time::Duration;

/// The advisory-lock class of queue `queue`'s dequeue slots.
pub fn dequeue_lock_key(queue: &str) -> i32 {
    fnv1a64(format!("shardq:dequeue:{queue}").as_bytes()) as u32 as i32
}

/// The advisory-lock class of per-shard maintenance (recovery, promotion,
/// retention use slots 0, 1, 2 of it).
pub fn maintenance_lock_key() -> i32 {
    fnv1a64(b"shardq:maintenance") as u32 as i32
}

/// What a claim attempt found.
#[derive(Debug)]
pub enum Claim {
    /// Jobs claimed (at least one).
    Jobs(Vec<ClaimedJob>),
    /// Every dequeue slot was taken: try another shard.
    Busy,
    /// A slot was free but no job was ready.
    Empty,
}

/// One claim request.
#[derive(Debug, Clone, Copy)]
pub struct ClaimParams<'a> {
    /// Queue.
    pub queue: &'a str,
    /// Most jobs to take.
    pub limit: u32,
    /// Owner written on the rows (fences completions).
    pub owner: &'a str,
    /// Lease length.
    pub lease: Duration,
    /// Gated or not.
    pub mode: DequeueMode,
}

fn gated_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(sql::job_claim_gated)
}

fn ungated_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(sql::job_claim_ungated)
}

/// Claims up to `p.limit` ready jobs of `p.queue` on `shard`, in one round trip.
///
/// # Errors
///
/// [`ShardError`] when the shard cannot be reached or the statement fails
/// (e.g. `lock_timeout` under a table lock).
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future after the statement was sent may leave
/// claimed jobs that only lease recovery returns.
pub async fn claim(shard: &Shard, p: ClaimParams<'_>) -> Result<Claim, ShardError> {
    let client = shard.client().await?;
    let (text, slots) = match p.mode {
        DequeueMode::Gated { slots } => (gated_sql(), slots as i32),
        DequeueMode::Ungated => (ungated_sql(), 0),
    };
    let stmt = client
        .prepare_cached(text)
        .await
        .map_err(|e| shard.query_error(e))?;
    let lease_ms = p.lease.as_millis() as i64;
    let rows = client
        .query(
            &stmt,
            &[
                &dequeue_lock_key(p.queue),
                &slots,
                &p.queue,
                &i64::from(p.limit),
                &p.owner,
                &lease_ms,
            ],
        )
        .await
        .map_err(|e| shard.query_error(e))?;
    let got_slot: i32 = rows.first().map_or(0, |r| r.get("got_slot"));
    if got_slot == 0 {
        return Ok(Claim::Busy);
    }
    let jobs: Vec<ClaimedJob> = rows
        .iter()
        .filter_map(|r| {
            // The one row of an empty claim carries NULLs.
            let id: i64 = r.get::<_, Option<i64>>("id")?;
            Some(ClaimedJob {
                id: JobId {
                    shard_key: r.get("shard_key"),
                    id,
                },
                shard: shard.index,
                queue: r.get("queue"),
                handler: r.get("handler"),
                ordering_key: r.get("ordering_key"),
                payload: r.get("payload"),
                attempt: r.get("attempts"),
                created_at: r.get("created_at"),
            })
        })
        .collect();
    Ok(if jobs.is_empty() {
        Claim::Empty
    } else {
        Claim::Jobs(jobs)
    })
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
    /// Completions rejected by the fence (lease lost, job re-claimed).
    pub fenced: u64,
}

/// Writes `done` (all from `shard`) in one fenced statement.
///
/// # Errors
///
/// [`ShardError`] when the write fails; nothing was written then.
pub async fn complete_many(
    shard: &Shard,
    owner: &str,
    retry: Backoff,
    done: &[Completion],
) -> Result<Written, ShardError> {
    let client = shard.client().await?;
    let stmt = client
        .prepare_cached(sql::JOB_COMPLETE_MANY)
        .await
        .map_err(|e| shard.query_error(e))?;
    let keys: Vec<i32> = done.iter().map(|c| c.id.shard_key).collect();
    let ids: Vec<i64> = done.iter().map(|c| c.id.id).collect();
    let attempts: Vec<i32> = done.iter().map(|c| c.attempt).collect();
    let mut statuses = Vec::with_capacity(done.len());
    let mut outputs: Vec<Option<&Value>> = Vec::with_capacity(done.len());
    let mut errors: Vec<Option<&str>> = Vec::with_capacity(done.len());
    for c in done {
        match &c.outcome {
            Outcome::Succeeded(v) => {
                statuses.push("succeeded");
                outputs.push(Some(v));
                errors.push(None);
            }
            Outcome::Failed(msg) => {
                statuses.push("failed");
                outputs.push(None);
                errors.push(Some(msg.as_str()));
            }
        }
    }
    let row = client
        .query_one(
            &stmt,
            &[
                &keys,
                &ids,
                &attempts,
                &statuses,
                &outputs,
                &owner,
                &errors,
                &(retry.min.as_millis() as f64),
                &(retry.max.as_millis() as f64),
            ],
        )
        .await
        .map_err(|e| shard.query_error(e))?;
    let count = |i| row.get::<_, i64>(i) as u64;
    let mut written = Written {
        succeeded: count(0),
        retrying: count(1),
        dead: count(2),
        cancelled: count(3),
        fenced: 0,
    };
    written.fenced = done.len() as u64
        - (written.succeeded + written.retrying + written.dead + written.cancelled);
    Ok(written)
}

/// Gives claimed jobs that never started back to the queue at once (their
/// attempt is not counted). Returns how many were released.
///
/// # Errors
///
/// [`ShardError`] when the shard fails; the jobs then return by lease expiry.
pub async fn release_many(
    shard: &Shard,
    owner: &str,
    jobs: &[ClaimedJob],
) -> Result<u64, ShardError> {
    let client = shard.client().await?;
    let keys: Vec<i32> = jobs.iter().map(|j| j.id.shard_key).collect();
    let ids: Vec<i64> = jobs.iter().map(|j| j.id.id).collect();
    let attempts: Vec<i32> = jobs.iter().map(|j| j.attempt).collect();
    client
        .execute(sql::JOB_RELEASE_MANY, &[&keys, &ids, &attempts, &owner])
        .await
        .map_err(|e| shard.query_error(e))
}

/// Extends the lease of every job `owner` holds on `shard` to `lease` from now.
/// Returns how many leases were extended.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn extend_leases(shard: &Shard, owner: &str, lease: Duration) -> Result<u64, ShardError> {
    let client = shard.client().await?;
    let stmt = client
        .prepare_cached(sql::JOB_EXTEND_LEASES)
        .await
        .map_err(|e| shard.query_error(e))?;
    client
        .execute(&stmt, &[&owner, &(lease.as_millis() as i64)])
        .await
        .map_err(|e| shard.query_error(e))
}

/// Running jobs of `owner` on `shard` whose cancellation was asked.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn cancel_requested(shard: &Shard, owner: &str) -> Result<Vec<JobId>, ShardError> {
    let client = shard.client().await?;
    let rows = client
        .query(sql::JOB_CANCEL_REQUESTED, &[&owner])
        .await
        .map_err(|e| shard.query_error(e))?;
    Ok(rows
        .iter()
        .map(|r| JobId {
            shard_key: r.get(0),
            id: r.get(1),
        })
        .collect())
}
