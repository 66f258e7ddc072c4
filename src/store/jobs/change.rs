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
    let row = change(shard, id, sql::JOB_CANCEL).await?;
    Ok(row.map(|r| JobStatus::from_column(r.get("status"))))
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
