//! Durable workflow steps.

use super::exec;
use super::sql;
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use serde_json::Value;
use std::time::Duration;
use tokio_postgres::types::Type;

/// The recorded output of step `name` of workflow `id`: `None` when not
/// recorded, `Some(None)` when recorded as SQL NULL.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
#[cfg(feature = "internal")]
pub async fn get(
    shard: &Shard,
    id: JobId,
    name: &str,
) -> Result<Option<Option<Value>>, ShardError> {
    let row = exec::query_opt(
        shard,
        sql::STEP_GET,
        &[
            (&id.shard_key, Type::INT4),
            (&id.id, Type::INT8),
            (&name, Type::TEXT),
        ],
    )
    .await?;
    Ok(row.map(|r| r.get("output")))
}

/// A workflow's step log as one claim sees it ([`log`]).
#[derive(Debug, Clone, Default)]
pub struct StepLog {
    /// Recorded outputs by step name (`None`: recorded as SQL NULL).
    pub steps: std::collections::HashMap<String, Option<Value>>,
    /// Whether the claim holds the workflow.
    pub held: bool,
    /// How much longer its lease runs by the shard's clock (zero when not
    /// held): until then no other claim records a step of it.
    pub lease_left: std::time::Duration,
}

/// Every recorded step of workflow `id`, and whether the claim (`owner`,
/// `fence`) holds it and for how long ([`sql::STEP_LOG`]), in one statement.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn log(shard: &Shard, id: JobId, owner: &str, fence: i64) -> Result<StepLog, ShardError> {
    let rows = exec::query(
        shard,
        sql::STEP_LOG,
        &[
            (&id.shard_key, Type::INT4),
            (&id.id, Type::INT8),
            (&owner, Type::TEXT),
            (&fence, Type::INT8),
        ],
    )
    .await?;
    let mut log = StepLog::default();
    for r in &rows {
        log.held = r.get::<_, Option<bool>>("held").unwrap_or(false);
        if log.held {
            let left: i64 = r.get("lease_left_us");
            log.lease_left = std::time::Duration::from_micros(left.max(0) as u64);
        }
        if let Some(name) = r.get::<_, Option<String>>("step_name") {
            log.steps.insert(name, r.get("output"));
        }
    }
    Ok(log)
}

/// A step output to record.
#[derive(Debug, Clone, Copy)]
pub struct RecordStep<'a> {
    /// The workflow (job).
    pub id: JobId,
    /// Step name.
    pub name: &'a str,
    /// Its output.
    pub output: &'a Value,
    /// The worker holding the workflow.
    pub owner: &'a str,
    /// The fence of its claim.
    pub fence: i64,
}

/// Records a step's output, fenced ([`sql::STEP_RECORD`]): only while the
/// workflow is still running under this owner and claim and not being
/// cancelled. Returns whether it is recorded (now or before).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe in effect: a repeat finds the step recorded.
pub async fn record(shard: &Shard, p: RecordStep<'_>) -> Result<bool, ShardError> {
    let row = exec::query_one(
        shard,
        sql::STEP_RECORD,
        &[
            (&p.id.shard_key, Type::INT4),
            (&p.id.id, Type::INT8),
            (&p.name, Type::TEXT),
            (&p.output, Type::JSONB),
            (&p.owner, Type::TEXT),
            (&p.fence, Type::INT8),
        ],
    )
    .await?;
    Ok(row.get("recorded"))
}

/// Makes a workflow held by this claim ready again about `after` from the
/// shard's clock, for its `parked` outcome ([`sql::RUN_AGAIN_IN`]).
/// Returns whether the claim still held it.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe in effect: one statement; a repeat moves the time again.
pub async fn run_again_in(
    shard: &Shard,
    id: JobId,
    owner: &str,
    fence: i64,
    after: Duration,
) -> Result<bool, ShardError> {
    let ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
    let changed = exec::execute(
        shard,
        sql::RUN_AGAIN_IN,
        &[
            (&id.shard_key, Type::INT4),
            (&id.id, Type::INT8),
            (&owner, Type::TEXT),
            (&fence, Type::INT8),
            (&ms, Type::INT8),
        ],
    )
    .await?;
    Ok(changed > 0)
}

/// A durable sleep of a workflow, as [`sleep`] records or finds it.
#[derive(Debug, Clone, Copy)]
pub struct Sleep<'a> {
    /// The workflow (job).
    pub id: JobId,
    /// The sleep's step name.
    pub name: &'a str,
    /// How long from the shard's clock now, when it is not recorded yet ...
    pub duration: std::time::Duration,
    /// ... or until when (then `duration` is not used).
    pub until: Option<std::time::SystemTime>,
    /// The worker holding the workflow.
    pub owner: &'a str,
    /// The fence of its claim.
    pub fence: i64,
}

/// Where a durable sleep stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slept {
    /// The shard's clock has passed the wake time.
    Due,
    /// Not yet: the workflow is to park until then (its `run_at` is set).
    Until(std::time::SystemTime),
    /// The workflow's cancellation was asked.
    Cancelled,
    /// This claim no longer holds the workflow (its lease was lost).
    NotHeld,
}

/// Records the sleep's wake time by the shard's clock the first time, reads
/// it back after ([`sql::STEP_SLEEP`]).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe in effect: a repeat finds the sleep recorded, its wake time
/// unchanged.
pub async fn sleep(shard: &Shard, p: Sleep<'_>) -> Result<Slept, ShardError> {
    let micros = i64::try_from(p.duration.as_micros()).unwrap_or(i64::MAX);
    let row = exec::query_one(
        shard,
        sql::STEP_SLEEP,
        &[
            (&p.id.shard_key, Type::INT4),
            (&p.id.id, Type::INT8),
            (&p.name, Type::TEXT),
            (&p.owner, Type::TEXT),
            (&p.fence, Type::INT8),
            (&micros, Type::INT8),
            (&p.until, Type::TIMESTAMPTZ),
        ],
    )
    .await?;
    Ok(if row.get::<_, bool>("cancelled") {
        Slept::Cancelled
    } else if !row.get::<_, bool>("owned") {
        Slept::NotHeld
    } else if row.get::<_, bool>("due") {
        Slept::Due
    } else {
        Slept::Until(row.get("wake_at"))
    })
}
