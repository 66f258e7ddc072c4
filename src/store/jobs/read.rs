//! Reading one job.

use super::super::exec;
use super::super::sql::{self, Param};
use super::super::JobStatus;
use crate::job::{JobId, NewJob};
use crate::shards::{Shard, ShardError};
use serde_json::Value;
use tokio_postgres::types::Type;

/// One job, as `shardq job show` prints it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobInfo {
    /// `shard_key:id`.
    pub id: String,
    /// Queue.
    pub queue: String,
    /// Handler name.
    pub handler: String,
    /// Ordering key.
    pub ordering_key: Option<String>,
    /// Priority (lower first).
    pub priority: i32,
    /// State.
    pub status: JobStatus,
    /// Payload.
    pub payload: Value,
    /// Output, once succeeded.
    pub output: Option<Value>,
    /// Last error.
    pub error: Option<String>,
    /// Attempts started.
    pub attempts: i32,
    /// Attempt limit.
    pub max_attempts: i32,
    /// Worker holding it, while running.
    pub owner: Option<String>,
    /// Deduplication id.
    pub dedup_id: Option<String>,
    /// Group ([`crate::NewJob::group`]).
    pub group: Option<String>,
    /// Whether cancellation was asked.
    pub cancel_requested: bool,
    /// Timestamps, as the database prints them.
    pub created_at: Option<String>,
    /// When it is (or was) due.
    pub run_at: Option<String>,
    /// When its last attempt started.
    pub started_at: Option<String>,
    /// When it finished.
    pub finished_at: Option<String>,
    /// What a parked workflow waits for, and until when (a durable sleep's
    /// wake time, a recv's topic and deadline, or `child workflow <id>`).
    pub waiting_for: Option<String>,
    /// Its deadline ([`crate::NewJob::timeout`]), as the database prints
    /// it: past it the workflow ends `cancelled`.
    pub deadline_at: Option<String>,
}

/// A job's state and result columns.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOutcomeRow {
    /// State.
    pub status: JobStatus,
    /// Output, once succeeded.
    pub output: Option<Value>,
    /// Last error.
    pub error: Option<String>,
}

fn id_params(id: &JobId) -> [Param<'_>; 2] {
    [(&id.shard_key, Type::INT4), (&id.id, Type::INT8)]
}

/// Job `id` on `shard`, if that shard holds it.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn get(shard: &Shard, id: JobId) -> Result<Option<JobInfo>, ShardError> {
    let row = exec::query_opt(shard, sql::JOB_GET, &id_params(&id)).await?;
    Ok(row.map(|r| JobInfo {
        id: id.to_string(),
        queue: r.get("queue"),
        handler: r.get("handler"),
        ordering_key: r.get("ordering_key"),
        priority: r.get("priority"),
        status: JobStatus::from_column(r.get("status")),
        payload: r.get("payload"),
        output: r.get("output"),
        error: r.get("error"),
        attempts: r.get("attempts"),
        max_attempts: r.get("max_attempts"),
        owner: r.get("owner"),
        dedup_id: r.get("dedup_id"),
        group: r.get("job_group"),
        cancel_requested: r.get("cancel_requested"),
        created_at: r.get("created_at"),
        run_at: r.get("run_at"),
        started_at: r.get("started_at"),
        finished_at: r.get("finished_at"),
        waiting_for: r.get("waiting_for"),
        deadline_at: r.get("deadline_at"),
    }))
}

/// The state, output and error of job `id` on `shard`, if it holds it.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn outcome(shard: &Shard, id: JobId) -> Result<Option<JobOutcomeRow>, ShardError> {
    let row = exec::query_opt(shard, sql::JOB_OUTCOME, &id_params(&id)).await?;
    Ok(row.map(|r| JobOutcomeRow {
        status: JobStatus::from_column(r.get("status")),
        output: r.get("output"),
        error: r.get("error"),
    }))
}

/// The ids, among `jobs` (each under the id it was given), of those
/// `shard` holds with that content: queue, handler, payload and ordering
/// key (one statement, a primary-key probe per job). A row under the same
/// id with other content is another job, copied here by a move.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn present(shard: &Shard, jobs: &[(JobId, &NewJob)]) -> Result<Vec<i64>, ShardError> {
    let ids: Vec<i64> = jobs.iter().map(|(j, _)| j.id).collect();
    let keys: Vec<i32> = jobs.iter().map(|(j, _)| j.shard_key).collect();
    let queues: Vec<&str> = jobs.iter().map(|(_, n)| n.queue.as_str()).collect();
    let handlers: Vec<&str> = jobs.iter().map(|(_, n)| n.handler.as_str()).collect();
    let payloads: Vec<String> = jobs.iter().map(|(_, n)| n.payload.to_string()).collect();
    let ordering: Vec<Option<&str>> = jobs
        .iter()
        .map(|(_, n)| n.ordering_key.as_deref())
        .collect();
    let rows = exec::query(
        shard,
        sql::JOBS_PRESENT,
        &[
            (&ids, Type::INT8_ARRAY),
            (&keys, Type::INT4_ARRAY),
            (&queues, Type::TEXT_ARRAY),
            (&handlers, Type::TEXT_ARRAY),
            (&payloads, Type::TEXT_ARRAY),
            (&ordering, Type::TEXT_ARRAY),
        ],
    )
    .await?;
    Ok(rows.iter().map(|r| r.get("id")).collect())
}

/// Whether `shard` holds job `id` (one primary-key probe).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn exists(shard: &Shard, id: JobId) -> Result<bool, ShardError> {
    Ok(exec::query_opt(shard, sql::JOB_EXISTS, &id_params(&id))
        .await?
        .is_some())
}
