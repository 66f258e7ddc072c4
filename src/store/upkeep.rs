//! Per-shard upkeep, each gated by its own advisory lock so that one process
//! at a time does it on a shard: recovery of expired leases, promotion of due
//! scheduled jobs, deletion of old finished jobs.

use super::exec::{self, under_key_locks_in};
use super::locks;
use super::sql::{self, Param};
use super::JobStatus;
use crate::shards::{Shard, ShardError};
use std::time::Duration;
use tokio_postgres::types::Type;

/// What one recovery pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Jobs back in the queue.
    pub requeued: u64,
    /// Jobs past their attempt limit, now dead.
    pub dead: u64,
    /// Jobs whose cancellation was asked, now cancelled.
    pub cancelled: u64,
}

/// Returns up to `limit` jobs with expired leases on `shard` to the queue
/// (attempt count kept), unless another process is doing it. Keyed jobs go
/// back behind their key, under its lock, and free keys are released.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one transaction, committed or not.
pub async fn recover_expired(shard: &Shard, limit: i64) -> Result<Recovered, ShardError> {
    shard
        .within(async move {
            let mut client = shard.lend().await?;
            let recovered = recover_on(shard, &mut client, limit).await;
            client.settle();
            recovered
        })
        .await
}

/// [`recover_expired`] on a lent connection.
async fn recover_on(
    shard: &Shard,
    client: &mut deadpool_postgres::Client,
    limit: i64,
) -> Result<Recovered, ShardError> {
    let err = |e| shard.query_error(e);
    let tx = client.transaction().await.map_err(err)?;
    let gate = tx
        .query_typed(
            sql::UPKEEP_GATE,
            &[
                (&locks::maintenance_class(), Type::INT4),
                (&locks::RECOVERY_SLOT, Type::INT4),
            ],
        )
        .await
        .map_err(err)?;
    if !gate.first().is_some_and(|row| row.get::<_, bool>("got")) {
        return Ok(Recovered::default());
    }
    let expired = tx
        .query_typed(sql::JOB_FIND_EXPIRED, &[(&limit, Type::INT8)])
        .await
        .map_err(err)?;
    if expired.is_empty() {
        return Ok(Recovered::default());
    }
    let keys: Vec<i32> = expired.iter().map(|r| r.get("shard_key")).collect();
    let ids: Vec<i64> = expired.iter().map(|r| r.get("id")).collect();
    let params: [Param; 2] = [(&keys, Type::INT4_ARRAY), (&ids, Type::INT8_ARRAY)];
    let rows = under_key_locks_in(&tx, &keys, &ids, sql::JOB_RECOVER_EXPIRED, &params)
        .await
        .map_err(err)?;
    tx.commit().await.map_err(err)?;
    let mut out = Recovered::default();
    for row in rows {
        match JobStatus::from_column(row.get("status")) {
            JobStatus::Queued | JobStatus::Waiting => out.requeued += 1,
            JobStatus::Dead => out.dead += 1,
            _ => out.cancelled += 1,
        }
    }
    Ok(out)
}

/// Makes up to `limit` due scheduled jobs on `shard` ready, unless another
/// process is doing it. Returns how many.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one statement.
pub async fn promote_due(shard: &Shard, limit: i64) -> Result<u64, ShardError> {
    exec::execute(
        shard,
        sql::JOB_PROMOTE_DUE,
        &[
            (&locks::maintenance_class(), Type::INT4),
            (&locks::PROMOTION_SLOT, Type::INT4),
            (&limit, Type::INT8),
        ],
    )
    .await
}

/// Deletes up to `limit` jobs on `shard` finished more than `age` ago, with
/// their steps, unless another process is doing it. Returns how many.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one statement.
pub async fn delete_finished(shard: &Shard, age: Duration, limit: i64) -> Result<u64, ShardError> {
    let age_ms = age.as_millis() as i64;
    exec::execute(
        shard,
        sql::JOB_DELETE_FINISHED,
        &[
            (&locks::maintenance_class(), Type::INT4),
            (&locks::RETENTION_SLOT, Type::INT4),
            (&age_ms, Type::INT8),
            (&limit, Type::INT8),
        ],
    )
    .await
}
