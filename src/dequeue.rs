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
use crate::sql::{self, Param};
use serde_json::Value;
use std::time::Duration;
use tokio_postgres::types::Type;

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

/// Claims up to `p.limit` ready jobs of `p.queue` on `shard`, in one round trip.
/// The jobs' [`ClaimedJob::claim`] is 0: the caller numbers its claims.
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
    shard
        .within(async move {
            let client = shard.client().await?;
            let slots = match p.mode {
                DequeueMode::Gated { slots } => slots as i32,
                DequeueMode::Ungated => 0,
            };
            let lease_ms = p.lease.as_millis() as i64;
            let rows = client
                .query_typed(
                    sql::JOB_CLAIM,
                    &[
                        (&dequeue_lock_key(p.queue), Type::INT4),
                        (&slots, Type::INT4),
                        (&p.queue, Type::TEXT),
                        (&(p.limit as i32), Type::INT4),
                        (&p.owner, Type::TEXT),
                        (&lease_ms, Type::INT8),
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
                        fence: r.get("fence"),
                        claim: 0,
                        created_at: r.get("created_at"),
                    })
                })
                .collect();
            Ok(if jobs.is_empty() {
                Claim::Empty
            } else {
                Claim::Jobs(jobs)
            })
        })
        .await
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

/// Writes `done` (all from `shard`) in one fenced statement. When some of
/// them have ordering keys, the statement runs in a transaction between
/// taking their key locks and releasing the keys that are free afterwards.
///
/// # Errors
///
/// [`ShardError`] when the write fails; nothing was written then. Classify
/// with [`ShardError::is_permanent`].
pub async fn complete_many(
    shard: &Shard,
    owner: &str,
    retry: Backoff,
    done: &[Completion],
) -> Result<Written, ShardError> {
    shard
        .within(async move {
            let mut client = shard.client().await?;
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
                    Outcome::Released => ("released", None, None),
                };
                statuses.push(status);
                outputs.push(output);
                errors.push(error);
            }
            let (min_ms, max_ms) = (retry.min.as_millis() as f64, retry.max.as_millis() as f64);
            let params: [Param; 9] = [
                (&keys, Type::INT4_ARRAY),
                (&ids, Type::INT8_ARRAY),
                (&fences, Type::INT8_ARRAY),
                (&statuses, Type::TEXT_ARRAY),
                (&outputs, Type::JSONB_ARRAY),
                (&owner, Type::TEXT),
                (&errors, Type::TEXT_ARRAY),
                (&min_ms, Type::FLOAT8),
                (&max_ms, Type::FLOAT8),
            ];
            let err = |e| shard.query_error(e);
            let row = if done.iter().any(|c| c.keyed) {
                let tx = client.transaction().await.map_err(err)?;
                let mut rows = under_key_locks(&tx, &keys, &ids, sql::JOB_COMPLETE_MANY, &params)
                    .await
                    .map_err(err)?;
                tx.commit().await.map_err(err)?;
                rows.pop().expect("one count row")
            } else {
                client
                    .query_typed(sql::JOB_COMPLETE_MANY, &params)
                    .await
                    .map_err(err)?
                    .pop()
                    .expect("one count row")
            };
            let count = |i| row.get::<_, i64>(i) as u64;
            let mut written = Written {
                succeeded: count(0),
                retrying: count(1),
                dead: count(2),
                cancelled: count(3),
                released: count(4),
                already: count(5),
                fenced: 0,
            };
            written.fenced = done.len() as u64 - written.total();
            Ok(written)
        })
        .await
}

/// Runs `statement` in `tx` between taking the key locks of the jobs
/// (`keys`, `ids`) and releasing the keys it left free (their lowest waiting
/// job is queued). Every change to keyed jobs but the claim goes through here.
///
/// # Errors
///
/// The first statement that fails; the caller's transaction then rolls back.
pub(crate) async fn under_key_locks(
    tx: &deadpool_postgres::Transaction<'_>,
    keys: &[i32],
    ids: &[i64],
    statement: &str,
    params: &[Param<'_>],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let job_ids: [Param; 2] = [(&keys, Type::INT4_ARRAY), (&ids, Type::INT8_ARRAY)];
    tx.query_typed(sql::KEYS_LOCK, &job_ids).await?;
    let rows = tx.query_typed(statement, params).await?;
    tx.query_typed(sql::KEYS_PROMOTE, &job_ids).await?;
    Ok(rows)
}

/// Extends to `lease` from now the leases of `held` (jobs of `shard` that
/// `owner` holds, with their fences). Returns how many were extended.
///
/// # Errors
///
/// [`ShardError`] when the shard fails or does not answer in time.
pub async fn extend_leases(
    shard: &Shard,
    owner: &str,
    held: &[(JobId, i64)],
    lease: Duration,
) -> Result<u64, ShardError> {
    shard
        .within(async move {
            let client = shard.client().await?;
            let keys: Vec<i32> = held.iter().map(|(j, _)| j.shard_key).collect();
            let ids: Vec<i64> = held.iter().map(|(j, _)| j.id).collect();
            let fences: Vec<i64> = held.iter().map(|(_, f)| *f).collect();
            let lease_ms = lease.as_millis() as i64;
            client
                .execute_typed(
                    sql::JOB_EXTEND_LEASES,
                    &[
                        (&keys, Type::INT4_ARRAY),
                        (&ids, Type::INT8_ARRAY),
                        (&fences, Type::INT8_ARRAY),
                        (&owner, Type::TEXT),
                        (&lease_ms, Type::INT8),
                    ],
                )
                .await
                .map_err(|e| shard.query_error(e))
        })
        .await
}

/// Which of `held` (jobs of `shard` this process holds, started or not)
/// had their cancellation asked.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn cancel_requested(shard: &Shard, held: &[JobId]) -> Result<Vec<JobId>, ShardError> {
    shard
        .within(async move {
            let client = shard.client().await?;
            let keys: Vec<i32> = held.iter().map(|j| j.shard_key).collect();
            let ids: Vec<i64> = held.iter().map(|j| j.id).collect();
            let rows = client
                .query_typed(
                    sql::JOB_CANCEL_REQUESTED,
                    &[(&keys, Type::INT4_ARRAY), (&ids, Type::INT8_ARRAY)],
                )
                .await
                .map_err(|e| shard.query_error(e))?;
            Ok(rows
                .iter()
                .map(|r| JobId {
                    shard_key: r.get(0),
                    id: r.get(1),
                })
                .collect())
        })
        .await
}

/// Running jobs of `owner` on `shard` claimed more than `age` ago: (id,
/// fence, has a key). See [`sql::JOB_OWNED_RUNNING`].
///
/// # Errors
///
/// [`ShardError`] when the shard fails or does not answer in time.
pub async fn owned_running(
    shard: &Shard,
    owner: &str,
    age: Duration,
) -> Result<Vec<(JobId, i64, bool)>, ShardError> {
    shard
        .within(async move {
            let client = shard.client().await?;
            let age_ms = age.as_millis() as i64;
            let rows = client
                .query_typed(
                    sql::JOB_OWNED_RUNNING,
                    &[(&owner, Type::TEXT), (&age_ms, Type::INT8)],
                )
                .await
                .map_err(|e| shard.query_error(e))?;
            Ok(rows
                .iter()
                .map(|r| {
                    let id = JobId {
                        shard_key: r.get(0),
                        id: r.get(1),
                    };
                    (id, r.get(2), r.get(3))
                })
                .collect())
        })
        .await
}
