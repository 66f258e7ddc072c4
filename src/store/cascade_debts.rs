//! The rows of `shardq_cascades_owed`, below both the cancel cascade and
//! the pass over the cascades owed: paying a debt (a cascade reached every
//! child), and what a shard owes, for the exporter.

use super::exec;
use super::sql;
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use tokio_postgres::types::Type;

/// Drops the cascades owed on `shard` (where they were cancelled) by the
/// workflows given, each up to the generation its payer read before its
/// cascade started: that cascade reached every child.
///
/// # Errors
///
/// [`ShardError`] when the shard fails (or this role may not pay:
/// `docs/least_privilege.sql`): the cascades stay owed, and the workers'
/// pass runs them once more.
///
/// # Cancel safety
///
/// Cancel safe in effect: one statement; a repeat deletes nothing.
pub async fn paid(shard: &Shard, debts: &[(JobId, i64)]) -> Result<(), ShardError> {
    if debts.is_empty() {
        return Ok(());
    }
    let keys: Vec<i32> = debts.iter().map(|(p, _)| p.shard_key).collect();
    let ids: Vec<i64> = debts.iter().map(|(p, _)| p.id).collect();
    let generations: Vec<i64> = debts.iter().map(|(_, g)| *g).collect();
    let params: [sql::Param; 3] = [
        (&keys, Type::INT4_ARRAY),
        (&ids, Type::INT8_ARRAY),
        (&generations, Type::INT8_ARRAY),
    ];
    exec::query(shard, sql::CASCADES_OWED_PAID, &params).await?;
    Ok(())
}

/// The cancel cascades a shard owes: how many, and how long the oldest
/// has been owed (the shard's clock).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct OwedSummary {
    /// Cascades owed.
    pub owed: i64,
    /// Seconds since the oldest was first owed (0 when none).
    pub oldest_s: f64,
}

/// How many cascades `shard` owes, and the oldest's age: read by the
/// exporter (`shardq metrics`).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn summary(shard: &Shard) -> Result<OwedSummary, ShardError> {
    let row = exec::query_one(shard, sql::CASCADES_OWED_SUMMARY, &[]).await?;
    Ok(OwedSummary {
        owed: row.get("owed"),
        oldest_s: row.get("oldest_s"),
    })
}
