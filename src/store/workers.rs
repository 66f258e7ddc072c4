//! Worker heartbeats: each worker process writes its own row on every shard
//! every few seconds (`shardq_workers`); operators read the live ones.

use super::exec;
use super::sql::{self, Param};
use super::upkeep;
use crate::heartbeat::ShardCountersSnapshot;
use crate::shards::{Shard, ShardError};
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
        count(c.claim_us),
    ];
    let queues = beat.queues.to_vec();
    let params: [Param; 12] = [
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
        (&values[6], Type::INT8),
    ];
    exec::execute(shard, sql::WORKER_HEARTBEAT, &params).await?;
    Ok(())
}

/// What one [`release_silent`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    /// Running jobs of silent workers given back (queued, waiting, dead or
    /// cancelled, as lease recovery would).
    pub jobs: u64,
    /// Rows of silent workers deleted (those left hold jobs not given back
    /// yet: a held key lock, a row being written).
    pub workers: u64,
}

/// Gives back, fenced, up to `limit` running jobs of the workers whose
/// heartbeat on `shard` stopped `after` or longer before `me`'s previous
/// beat there, and deletes the rows of those workers that hold no running
/// job any more. So a killed worker's jobs run again a few beats after it
/// died, not when their lease ends. A worker that was alive after all (cut
/// off, frozen) finds its completions fenced, and its jobs run again
/// elsewhere. Key locks are only tried, as in lease recovery: a job whose
/// key is held now waits for a later beat.
///
/// Run it before `me`'s own beat: the silence is judged against `me`'s
/// previous beat, the last moment `me` knows the shard answered, so a shard
/// that was itself unreachable is not taken for every worker's death. On
/// `me`'s first beat it does nothing.
///
/// Between its statements, without locks: enqueue (adds jobs, changes none
/// of these), the silent worker's own claims (committed after the first
/// statement, they are given back too: it re-runs them after a silence of
/// many beats), and writers of keys whose lock the try did not get, whose
/// jobs it leaves alone. The worker rows and the jobs found are locked, so
/// two releasers never work on one worker, and no completion changes a
/// found job in between.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one transaction, committed or not.
pub async fn release_silent(
    shard: &Shard,
    me: &str,
    after: Duration,
    limit: i64,
) -> Result<Released, ShardError> {
    let ms = count(after.as_millis() as u64);
    shard
        .within(async move {
            let err = |e| shard.query_error(e);
            let mut client = shard.lend().await?;
            let released = async {
                let tx = client.transaction().await?;
                let silent = tx
                    .query_typed(sql::WORKERS_SILENT, &[(&me, Type::TEXT), (&ms, Type::INT8)])
                    .await?;
                if silent.is_empty() {
                    return Ok(Released::default());
                }
                let owners: Vec<String> = silent.iter().map(|r| r.get("worker_id")).collect();
                let found = tx
                    .query_typed(
                        sql::JOBS_OF_OWNERS,
                        &[(&owners, Type::TEXT_ARRAY), (&limit, Type::INT8)],
                    )
                    .await?;
                let rows = upkeep::return_lost_in(
                    &tx,
                    &found,
                    sql::JOB_RELEASE_SILENT,
                    &[(&owners, Type::TEXT_ARRAY)],
                )
                .await?;
                let workers = tx
                    .execute_typed(sql::WORKERS_FORGET, &[(&owners, Type::TEXT_ARRAY)])
                    .await?;
                tx.commit().await?;
                Ok(Released {
                    jobs: rows.len() as u64,
                    workers,
                })
            }
            .await;
            client.settle();
            released.map_err(err)
        })
        .await
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
                claim_us: get(r, "claim_us"),
            },
        })
        .collect())
}
