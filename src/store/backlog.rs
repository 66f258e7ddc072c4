//! A shard's backlog for the metrics exporter: jobs by queue and unfinished
//! state, and how long each queue's oldest ready job has waited.

use super::exec;
use super::sql;
use crate::shards::{Shard, ShardError};

/// Jobs of one queue in one unfinished state on one shard.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueBacklog {
    /// Queue.
    pub queue: String,
    /// `queued` (ready), `waiting`, `retrying`, `delayed` or `running`.
    pub state: String,
    /// How many.
    pub count: i64,
    /// For `queued`: seconds since the queue's lowest-id ready job became
    /// ready (its `run_at`), by the shard's clock.
    pub oldest_ready_s: Option<f64>,
}

/// The backlog of every queue with an unfinished job on `shard`, in one
/// statement ([`sql::QUEUE_BACKLOG`]) that reads only partial indexes of
/// unfinished jobs: finished rows cost it nothing.
///
/// # Errors
///
/// [`ShardError`] when the shard fails or passes its statement deadline.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn read(shard: &Shard) -> Result<Vec<QueueBacklog>, ShardError> {
    let rows = exec::query(shard, sql::QUEUE_BACKLOG, &[]).await?;
    Ok(rows
        .iter()
        .map(|r| QueueBacklog {
            queue: r.get("queue"),
            state: r.get("state"),
            count: r.get("count"),
            oldest_ready_s: r.get("oldest_ready_s"),
        })
        .collect())
}
