//! The versioned shard map on a shard: reading the current epoch, and
//! recording epoch 1 under the migration lock.

use super::schema::MigrationTx;
use super::{exec, sql};
use crate::shard_map::KeyRange;
use crate::shards::{Shard, ShardError};
use tokio_postgres::types::Type;

/// The map a shard records at its current (highest) epoch, as read: not yet
/// checked to tile the key space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedMap {
    /// The epoch.
    pub epoch: i32,
    /// Shards in the map.
    pub shard_count: usize,
    /// Its ranges, by first key.
    pub ranges: Vec<KeyRange>,
}

/// The map `shard` records at its current epoch; `None` when it records
/// none (its schema is older than version 17, or it was never migrated).
///
/// Two statements: a writer of a new epoch between them commits its ranges
/// with its epoch row (one transaction), so the ranges read are those of
/// the epoch read, complete.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn current(shard: &Shard) -> Result<Option<RecordedMap>, ShardError> {
    let present: bool = exec::query_one(shard, sql::MAP_TABLES_EXIST, &[])
        .await?
        .get("present");
    if !present {
        return Ok(None);
    }
    let Some(row) = exec::query_opt(shard, sql::MAP_EPOCH_CURRENT, &[]).await? else {
        return Ok(None);
    };
    let epoch: i32 = row.get("epoch");
    let shard_count: i32 = row.get("shard_count");
    let ranges = exec::query(shard, sql::MAP_RANGES_OF, &[(&epoch, Type::INT4)])
        .await?
        .iter()
        .map(|r| KeyRange {
            first_key: r.get("first_key"),
            end_key: r.get("end_key"),
            shard_index: usize::try_from(r.get::<_, i32>("shard_index")).unwrap_or(usize::MAX),
        })
        .collect();
    Ok(Some(RecordedMap {
        epoch,
        shard_count: usize::try_from(shard_count).unwrap_or(0),
        ranges,
    }))
}

/// The epochs of `shard` whose ranges do not tile the key space (or name a
/// shard outside the epoch's count).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn untiled_epochs(shard: &Shard) -> Result<Vec<i32>, ShardError> {
    let rows = exec::query(shard, sql::MAP_EPOCHS_UNTILED, &[]).await?;
    Ok(rows.iter().map(|r| r.get("epoch")).collect())
}

/// The unfinished jobs (waiting, scheduled, queued, running) of `shard`
/// per shard key, (key, count), keys with none left out. Scans the table.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn unfinished_by_key(shard: &Shard) -> Result<Vec<(i32, i64)>, ShardError> {
    let rows = exec::query(shard, sql::MAP_UNFINISHED_BY_KEY, &[]).await?;
    Ok(rows
        .iter()
        .map(|r| (r.get("shard_key"), r.get("n")))
        .collect())
}

impl MigrationTx<'_> {
    /// Records epoch 1 (the formula's ranges for the recorded place) when
    /// no epoch is recorded; returns the ranges written.
    ///
    /// Under the migration lock no other `migrate` writes the map between
    /// this and the caller's tiling check.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than
    /// reused, so the server rolls the transaction back.
    pub async fn record_map_epoch_one(&self) -> Result<u64, ShardError> {
        self.client
            .execute(sql::MAP_EPOCH_ONE_RECORD, &[])
            .await
            .map_err(|e| self.shard.query_error(e))
    }

    /// The epochs whose ranges do not tile the key space, as
    /// [`untiled_epochs`] reads them, inside this transaction.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    pub async fn untiled_epochs(&self) -> Result<Vec<i32>, ShardError> {
        let rows = self
            .client
            .query(sql::MAP_EPOCHS_UNTILED, &[])
            .await
            .map_err(|e| self.shard.query_error(e))?;
        Ok(rows.iter().map(|r| r.get("epoch")).collect())
    }
}
