//! Questions about whole queues and servers: is anything left, how many jobs
//! in each state, how many connections.

use super::backlog::{self, StateCounts};
use super::exec;
use super::sql;
use crate::shards::{Shard, ShardError};
use tokio_postgres::types::Type;

/// Finished rows are counted exactly up to this many (by the statistics'
/// estimate); beyond, the estimate stands, since counting walks them all.
const FINISHED_EXACT_UP_TO: i64 = 200_000;

/// Jobs of one queue in one state on one shard.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueueCount {
    /// Queue (`*` for the estimate of all finished jobs).
    pub queue: String,
    /// A job state, or `retrying` / `delayed` for scheduled jobs that failed
    /// before or not, or `finished` for the estimate.
    pub status: String,
    /// How many.
    pub count: i64,
    /// Whether `count` is the planner's estimate rather than a count.
    pub estimated: bool,
    /// For `queued`: seconds since the longest-waiting ready job became due.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_ready_s: Option<f64>,
}

/// A server's client connections.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Connections {
    /// shardq's own pools.
    pub shardq: i64,
    /// shardq's user pools (transactional enqueue and your statements).
    pub user: i64,
    /// All client connections.
    pub total: i64,
    /// The server's `max_connections`.
    pub max: i64,
}

/// Whether `queue` has a queued, waiting, running or retrying job on `shard`
/// (one index probe per state).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn has_pending(shard: &Shard, queue: &str) -> Result<bool, ShardError> {
    let row = exec::query_one(shard, sql::QUEUE_HAS_PENDING, &[(&queue, Type::TEXT)]).await?;
    Ok(row.get("pending"))
}

/// A shard's job counts ([`counts`]).
#[derive(Debug, Clone)]
pub struct ShardCounts {
    /// By queue and state.
    pub counts: Vec<QueueCount>,
    /// Whether the `waiting`, `retrying`, `delayed` and `parked` jobs went
    /// uncounted: the full read ran past half the shard's deadline
    /// ([`backlog::read_within`]).
    pub bounded: bool,
}

/// Job counts on `shard` by queue and state: unfinished ones from the
/// queue-depth read ([`backlog::read_within`] the shard's deadline,
/// partial indexes only; states with no job left out), finished ones
/// exactly when few, else one estimate.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (reads).
pub async fn counts(shard: &Shard) -> Result<ShardCounts, ShardError> {
    let mut counts = Vec::new();
    let backlog = backlog::read_within(shard, None, shard.deadline()).await?;
    for q in backlog.queues {
        let mut states: Vec<(&str, i64)> = StateCounts::STATES
            .into_iter()
            .zip(q.depth.counts())
            .filter(|(_, n)| *n > 0)
            .collect();
        // By state name, as `shardq status` has always listed them.
        states.sort_by_key(|(state, _)| *state);
        counts.extend(states.into_iter().map(|(state, count)| QueueCount {
            queue: q.queue.clone(),
            status: state.to_string(),
            count,
            estimated: false,
            oldest_ready_s: if state == "queued" {
                q.oldest_ready_s
            } else {
                None
            },
        }));
    }
    let finished: i64 = exec::query_one(shard, sql::FINISHED_ESTIMATE, &[])
        .await?
        .get("estimate");
    if finished <= FINISHED_EXACT_UP_TO {
        let rows = exec::query(shard, sql::FINISHED_COUNTS, &[]).await?;
        counts.extend(rows.iter().map(|r| QueueCount {
            queue: r.get("queue"),
            status: r.get("state"),
            count: r.get("count"),
            estimated: false,
            oldest_ready_s: None,
        }));
    } else {
        counts.push(QueueCount {
            queue: "*".into(),
            status: "finished".into(),
            count: finished,
            estimated: true,
            oldest_ready_s: None,
        });
    }
    Ok(ShardCounts {
        counts,
        bounded: backlog.bounded,
    })
}

/// The client connections of `shard`'s server.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn connections(shard: &Shard) -> Result<Connections, ShardError> {
    let c = exec::query_one(shard, sql::SERVER_CONNECTIONS, &[]).await?;
    Ok(Connections {
        shardq: c.get("shardq"),
        user: c.get("user_pool"),
        total: c.get("total"),
        max: c.get("max_connections"),
    })
}

/// A queue paused on one shard.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ShardPause {
    /// Queue.
    pub queue: String,
    /// When it was paused (the shard's clock, as text).
    pub paused_at: String,
}

/// Pauses `queue` on `shard`: from the next claim statement on, no worker
/// claims its jobs there. Returns whether it was running before.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: the change is one statement, made or not.
pub async fn pause(shard: &Shard, queue: &str) -> Result<bool, ShardError> {
    Ok(exec::execute(shard, sql::QUEUE_PAUSE, &[(&queue, Type::TEXT)]).await? > 0)
}

/// Resumes `queue` on `shard` and wakes the workers that listen there.
/// Returns whether it was paused.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: the change is one statement, made or not.
pub async fn resume(shard: &Shard, queue: &str) -> Result<bool, ShardError> {
    Ok(
        exec::query_opt(shard, sql::QUEUE_RESUME, &[(&queue, Type::TEXT)])
            .await?
            .is_some(),
    )
}

/// The queues paused on `shard`.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn paused(shard: &Shard) -> Result<Vec<ShardPause>, ShardError> {
    let rows = exec::query(shard, sql::QUEUE_PAUSED, &[]).await?;
    Ok(rows
        .iter()
        .map(|r| ShardPause {
            queue: r.get("queue"),
            paused_at: r.get("paused_at"),
        })
        .collect())
}
