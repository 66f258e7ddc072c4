//! Changing one job on an operator's request: cancel, retry. Both run under
//! the job's key lock, since both can hold or free its key.

use super::super::exec::under_key_locks;
use super::super::sql::{self, Param};
use super::super::JobStatus;
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use tokio_postgres::types::Type;

async fn change(
    shard: &Shard,
    id: JobId,
    statement: &str,
) -> Result<Option<tokio_postgres::Row>, ShardError> {
    let params: [Param; 2] = [(&id.shard_key, Type::INT4), (&id.id, Type::INT8)];
    let mut rows = under_key_locks(shard, &[id.shard_key], &[id.id], statement, &params).await?;
    Ok(rows.pop())
}

/// Cancels job `id` on `shard`: an unstarted one at once, a running one by
/// asking its worker. Returns its state after the change; `None` when the
/// shard does not hold it unfinished.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Not cancel safe: the change may be made.
pub async fn cancel(shard: &Shard, id: JobId) -> Result<Option<JobStatus>, ShardError> {
    Ok(cancel_owing(shard, id).await?.map(|c| c.status))
}

/// A job cancelled (or its cancellation asked) by [`cancel_owing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled {
    /// Its state after the change.
    pub status: JobStatus,
    /// The generation of the cancel cascade it owes its children
    /// (`shardq_cascades_owed`), which whoever runs that cascade pays.
    pub owed: i64,
}

/// [`cancel`], also returning the generation of the cascade the job now
/// owes its children ([`super::super::cascade_debts::paid`]).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Not cancel safe: the change may be made.
pub async fn cancel_owing(shard: &Shard, id: JobId) -> Result<Option<Cancelled>, ShardError> {
    let row = change(shard, id, sql::JOB_CANCEL).await?;
    Ok(row.map(|r| Cancelled {
        status: JobStatus::from_column(r.get("status")),
        owed: r.get("owed"),
    }))
}

/// Puts a dead, failed or cancelled job `id` back with fresh attempts.
/// Returns whether it did. [`crate::store::ErrorKind::UniqueViolation`] when
/// another unfinished job of its queue took its deduplication id.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Not cancel safe: the change may be made.
pub async fn retry(shard: &Shard, id: JobId) -> Result<bool, ShardError> {
    Ok(change(shard, id, sql::JOB_RETRY).await?.is_some())
}
