//! What a worker does for the jobs it holds: extend their leases, ask
//! whether they were cancelled, and find the ones a lost claim reply left it
//! owning.

use super::super::exec;
use super::super::sql;
use super::ids::{id_arrays, job_id};
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use std::time::Duration;
use tokio_postgres::types::Type;

/// Jobs of one shard whose leases an owner extends.
#[derive(Debug, Clone, Copy)]
pub struct ExtendLeases<'a> {
    /// The claiming process.
    pub owner: &'a str,
    /// The jobs it holds, with the fences of their claims.
    pub held: &'a [(JobId, i64)],
    /// The new lease, from now.
    pub lease: Duration,
}

/// Extends the leases of `p.held` ([`sql::JOB_EXTEND_LEASES`]: one
/// primary-key probe per job). Returns how many were extended.
///
/// # Errors
///
/// [`ShardError`] when the shard fails or does not answer in time.
///
/// # Cancel safety
///
/// Cancel safe: an extension that lands or not changes only a deadline.
pub async fn extend_leases(shard: &Shard, p: ExtendLeases<'_>) -> Result<u64, ShardError> {
    let (keys, ids) = id_arrays(p.held.iter().map(|(j, _)| *j));
    let fences: Vec<i64> = p.held.iter().map(|(_, f)| *f).collect();
    let lease_ms = p.lease.as_millis() as i64;
    exec::execute(
        shard,
        sql::JOB_EXTEND_LEASES,
        &[
            (&keys, Type::INT4_ARRAY),
            (&ids, Type::INT8_ARRAY),
            (&fences, Type::INT8_ARRAY),
            (&p.owner, Type::TEXT),
            (&lease_ms, Type::INT8),
        ],
    )
    .await
}

/// Which of `held` (jobs of `shard` a process holds, started or not) had
/// their cancellation asked.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn cancel_requested(shard: &Shard, held: &[JobId]) -> Result<Vec<JobId>, ShardError> {
    let (keys, ids) = id_arrays(held.iter().copied());
    let rows = exec::query(
        shard,
        sql::JOB_CANCEL_REQUESTED,
        &[(&keys, Type::INT4_ARRAY), (&ids, Type::INT8_ARRAY)],
    )
    .await?;
    Ok(rows.iter().map(job_id).collect())
}

/// A running job of an owner, as [`owned_running`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedRunning {
    /// The job.
    pub id: JobId,
    /// Its claim's fence.
    pub fence: i64,
    /// Its ordering key as [`crate::job::key_order`] numbers it.
    pub key: Option<u64>,
}

/// Running jobs of `owner` on `shard` claimed more than `age` ago
/// ([`sql::JOB_OWNED_RUNNING`]; walks the shard's running rows, so run it
/// only after a claim's reply may have been lost).
///
/// # Errors
///
/// [`ShardError`] when the shard fails or does not answer in time.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn owned_running(
    shard: &Shard,
    owner: &str,
    age: Duration,
) -> Result<Vec<OwnedRunning>, ShardError> {
    let age_ms = age.as_millis() as i64;
    let rows = exec::query(
        shard,
        sql::JOB_OWNED_RUNNING,
        &[(&owner, Type::TEXT), (&age_ms, Type::INT8)],
    )
    .await?;
    Ok(rows
        .iter()
        .map(|r| OwnedRunning {
            id: job_id(r),
            fence: r.get("fence"),
            key: r
                .get::<_, Option<&str>>("ordering_key")
                .map(|key| crate::job::key_order(r.get("queue"), key)),
        })
        .collect())
}
