//! Worker heartbeats: each worker process writes its own row on every shard
//! every few seconds (`shardq_workers`); operators read the live ones.

use super::exec;
use super::sql::{self, Param};
use crate::shards::{Shard, ShardError};
use crate::worker::metrics::ShardCountersSnapshot;
use std::time::Duration;
use tokio_postgres::types::Type;

/// One heartbeat of one worker on one shard.
#[derive(Debug, Clone)]
pub struct Heartbeat<'a> {
    /// The worker's id (its lease owner string).
    pub worker_id: &'a str,
    /// Host name of its machine.
    pub host: &'a str,
    /// Its process id.
    pub pid: i32,
    /// The queues it serves.
    pub queues: &'a [String],
    /// How long it has run.
    pub running_for: Duration,
    /// Its counters for this shard, cumulative since it started.
    pub counters: ShardCountersSnapshot,
}

/// A live worker as its row on one shard says.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerRow {
    /// The worker's id.
    pub worker_id: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: i32,
    /// Queues it serves.
    pub queues: Vec<String>,
    /// When it started, as the database prints it.
    pub started_at: String,
    /// Milliseconds since its last heartbeat.
    pub heartbeat_age_ms: i64,
    /// Its counters for this shard at its last heartbeat.
    pub counters: ShardCountersSnapshot,
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Writes `beat` on `shard` (insert or update of the worker's row).
///
/// # Errors
///
/// [`ShardError`] when the shard fails (an unmigrated one: the table is missing).
///
/// # Cancel safety
///
/// Cancel safe: a repeat writes the same row.
pub async fn heartbeat(shard: &Shard, beat: &Heartbeat<'_>) -> Result<(), ShardError> {
    let c = &beat.counters;
    let running_ms = count(beat.running_for.as_millis() as u64);
    let values = [
        count(c.claims),
        count(c.claimed),
        count(c.busy),
        count(c.empty),
        count(c.errors),
        count(c.completed),
    ];
    let queues = beat.queues.to_vec();
    let params: [Param; 11] = [
        (&beat.worker_id, Type::TEXT),
        (&beat.host, Type::TEXT),
        (&beat.pid, Type::INT4),
        (&queues, Type::TEXT_ARRAY),
        (&running_ms, Type::INT8),
        (&values[0], Type::INT8),
        (&values[1], Type::INT8),
        (&values[2], Type::INT8),
        (&values[3], Type::INT8),
        (&values[4], Type::INT8),
        (&values[5], Type::INT8),
    ];
    exec::execute(shard, sql::WORKER_HEARTBEAT, &params).await?;
    Ok(())
}

/// Deletes the rows of workers silent for longer than `after`; returns how many.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe.
pub async fn expire(shard: &Shard, after: Duration) -> Result<u64, ShardError> {
    let ms = count(after.as_millis() as u64);
    exec::execute(shard, sql::WORKERS_EXPIRE, &[(&ms, Type::INT8)]).await
}

/// Deletes worker `worker_id`'s row (it is stopping).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe.
pub async fn remove(shard: &Shard, worker_id: &str) -> Result<(), ShardError> {
    exec::execute(shard, sql::WORKER_DELETE, &[(&worker_id, Type::TEXT)]).await?;
    Ok(())
}

/// The workers on `shard` whose last heartbeat is at most `within` old.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn live(shard: &Shard, within: Duration) -> Result<Vec<WorkerRow>, ShardError> {
    let ms = count(within.as_millis() as u64);
    let rows = exec::query(shard, sql::WORKERS_LIVE, &[(&ms, Type::INT8)]).await?;
    let get = |r: &tokio_postgres::Row, name: &str| r.get::<_, i64>(name).max(0) as u64;
    Ok(rows
        .iter()
        .map(|r| WorkerRow {
            worker_id: r.get("worker_id"),
            host: r.get("host"),
            pid: r.get("pid"),
            queues: r.get("queues"),
            started_at: r.get("started_at"),
            heartbeat_age_ms: r.get("heartbeat_age_ms"),
            counters: ShardCountersSnapshot {
                claims: get(r, "claims"),
                claimed: get(r, "claimed"),
                busy: get(r, "busy"),
                empty: get(r, "empty"),
                errors: get(r, "errors"),
                completed: get(r, "completed"),
            },
        })
        .collect())
}
