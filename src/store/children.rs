//! Child workflows on their parent's shard: starting one as a step of the
//! parent ([`sql::CHILD_START`]), the step that waits for its result
//! ([`sql::CHILD_RESULT_LOCK`] then [`sql::CHILD_RESULT_DECIDE`]), the
//! parents' wakes left to the promotion, and the cancel cascade's read.
//! [`sql::CHILD_RESULT_LOCK`]'s module says how a park and a child's
//! completion are ordered.

use super::exec;
use super::sql::{self, Param};
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use serde_json::Value;
use std::time::{Duration, SystemTime};
use tokio_postgres::types::Type;
use tokio_postgres::Row;

/// How long a parent parked on its child waits before it looks again by
/// itself. The child's completion wakes it (under the parent's row lock,
/// or by the promotion within a second when that lock was busy); this is
/// only a backstop, one replay an hour, should that ever not happen.
/// `shardq check` reads parked parents within it (`CheckOptions`).
pub(crate) const CHILD_RECHECK: Duration = Duration::from_secs(3600);

/// A child to start, as step `name` of workflow `parent`.
#[derive(Debug, Clone, Copy)]
pub struct StartChild<'a> {
    /// The parent workflow.
    pub parent: JobId,
    /// The step's name (`shardq:child:N`).
    pub name: &'a str,
    /// The worker holding the parent.
    pub owner: &'a str,
    /// The fence of its claim.
    pub fence: i64,
    /// The child's queue.
    pub queue: &'a str,
    /// Its handler.
    pub handler: &'a str,
    /// Its payload.
    pub payload: &'a Value,
    /// Its ordering key.
    pub ordering_key: Option<&'a str>,
    /// Its group.
    pub group: Option<&'a str>,
    /// Its priority.
    pub priority: i32,
    /// Not claimable before this much time has passed.
    pub delay: Duration,
    /// Its attempt limit.
    pub max_attempts: i32,
    /// Whether a cancel of the parent leaves it running.
    pub abandon_on_parent_cancel: bool,
    /// Its own timeout in ms (`NewJob::timeout`): its deadline is the
    /// earlier of this one and the one it inherits from its parent.
    pub timeout_ms: Option<i64>,
}

/// What a start did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// The child, started now or by an earlier run of the step.
    Child(JobId),
    /// The child's key routes to shard key `.0`, on shard index `.1` of the
    /// map, not this shard: nothing written.
    OtherShard(i32, Option<i32>),
    /// The parent's cancellation was asked: nothing written.
    Cancelled,
    /// This claim no longer holds the parent (its lease was lost).
    NotHeld,
}

/// Starts a child once per step ([`sql::CHILD_START`]): the child's row and
/// the step's record in one transaction.
///
/// # Errors
///
/// [`ShardError`] when the shard fails; nothing is written then, unless
/// the commit's reply was lost (the next run finds the step recorded).
///
/// # Cancel safety
///
/// Cancel safe in effect: a repeat finds the step recorded.
pub async fn start(shard: &Shard, p: StartChild<'_>) -> Result<Started, ShardError> {
    let delay_ms = i64::try_from(p.delay.as_millis()).unwrap_or(i64::MAX);
    let start: [Param; 14] = [
        (&p.parent.shard_key, Type::INT4),
        (&p.parent.id, Type::INT8),
        (&p.owner, Type::TEXT),
        (&p.fence, Type::INT8),
        (&p.name, Type::TEXT),
        (&p.queue, Type::TEXT),
        (&p.handler, Type::TEXT),
        (p.payload, Type::JSONB),
        (&p.ordering_key, Type::TEXT),
        (&p.group, Type::TEXT),
        (&p.priority, Type::INT4),
        (&delay_ms, Type::INT8),
        (&p.max_attempts, Type::INT4),
        (&p.abandon_on_parent_cancel, Type::BOOL),
    ];
    let row = match p.timeout_ms {
        // No timeout of its own: one statement, as before deadlines.
        None => exec::query_one(shard, sql::CHILD_START, &start).await?,
        Some(ms) => {
            let own: [Param; 4] = [
                (&p.parent.shard_key, Type::INT4),
                (&p.parent.id, Type::INT8),
                (&p.name, Type::TEXT),
                (&ms, Type::INT8),
            ];
            let started = |rows: &[Row]| {
                rows.first()
                    .is_some_and(|r| r.get::<_, &str>("state") == "started")
            };
            let (mut rows, _) = exec::lock_then(
                shard,
                (sql::CHILD_START, &start),
                (sql::CHILD_OWN_DEADLINE, &own),
                started,
            )
            .await?;
            rows.pop().expect("shardq_start_child returns one row")
        }
    };
    let key = || row.get::<_, Option<i32>>("child_shard_key").unwrap_or(-1);
    Ok(match row.get::<_, &str>("state") {
        "started" | "recorded" => Started::Child(JobId {
            shard_key: key(),
            id: row.get::<_, Option<i64>>("child_id").unwrap_or(-1),
        }),
        "other_shard" => Started::OtherShard(key(), row.get("child_index")),
        "cancelled" => Started::Cancelled,
        _ => Started::NotHeld,
    })
}

/// A result step of a parent, on one child.
#[derive(Debug, Clone, Copy)]
pub struct AwaitChild<'a> {
    /// The parent workflow.
    pub parent: JobId,
    /// The step's name (`shardq:child:N:result`).
    pub name: &'a str,
    /// The child.
    pub child: JobId,
    /// The worker holding the parent.
    pub owner: &'a str,
    /// The fence of its claim.
    pub fence: i64,
    /// How long the parent parks before it looks again by itself, should
    /// no wake come.
    pub recheck: Duration,
}

/// Where a result step stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Awaited {
    /// The child finished: its final row (`status`, `output`, `error`), as
    /// recorded by the step.
    Finished(Value),
    /// Not yet: the parent is to park (its `run_at` is this re-check
    /// time; the child's completion wakes it sooner).
    Waiting(SystemTime),
    /// The shard has no such child (removed by retention, or moved).
    Missing,
    /// The parent's cancellation was asked.
    Cancelled,
    /// This claim no longer holds the parent (its lease was lost).
    NotHeld,
}

/// Decides result step `name` once, in one round trip
/// ([`sql::CHILD_RESULT`]): under the parent's row lock
/// ([`sql::CHILD_RESULT_LOCK`]), then in a later statement
/// ([`sql::CHILD_RESULT_DECIDE`]) that sees a child's final status
/// committed before the lock was granted.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe in effect: a decision is recorded in its transaction, and
/// the next call returns it.
pub async fn result(shard: &Shard, p: AwaitChild<'_>) -> Result<Awaited, ShardError> {
    let recheck_ms = i64::try_from(p.recheck.as_millis()).unwrap_or(i64::MAX);
    let row = exec::query_one(
        shard,
        sql::CHILD_RESULT,
        &[
            (&p.parent.shard_key, Type::INT4),
            (&p.parent.id, Type::INT8),
            (&p.owner, Type::TEXT),
            (&p.fence, Type::INT8),
            (&p.name, Type::TEXT),
            (&p.child.shard_key, Type::INT4),
            (&p.child.id, Type::INT8),
            (&recheck_ms, Type::INT8),
        ],
    )
    .await?;
    if row.get::<_, bool>("cancel_requested") {
        return Ok(Awaited::Cancelled);
    }
    if !row.get::<_, bool>("owned") {
        return Ok(Awaited::NotHeld);
    }
    Ok(match row.get::<_, Option<Value>>("output") {
        Some(output) => Awaited::Finished(output),
        None if !row.get::<_, bool>("found") => Awaited::Missing,
        None => Awaited::Waiting(
            row.get::<_, Option<SystemTime>>("until")
                .unwrap_or(SystemTime::UNIX_EPOCH),
        ),
    })
}

/// The unfinished children of `parents` on `shard` that a cancel of their
/// parent cancels ([`sql::CHILDREN_UNFINISHED`]).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn unfinished(shard: &Shard, parents: &[JobId]) -> Result<Vec<JobId>, ShardError> {
    let keys: Vec<i32> = parents.iter().map(|p| p.shard_key).collect();
    let ids: Vec<i64> = parents.iter().map(|p| p.id).collect();
    let rows = exec::query(
        shard,
        sql::CHILDREN_UNFINISHED,
        &[(&keys, Type::INT4_ARRAY), (&ids, Type::INT8_ARRAY)],
    )
    .await?;
    Ok(rows
        .iter()
        .map(|r| JobId {
            shard_key: r.get("shard_key"),
            id: r.get("id"),
        })
        .collect())
}

/// Settles up to `limit` parents' wakes that children's completions left
/// to the promotion ([`sql::CHILD_WAKE_PENDING`]). Returns how many.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one statement.
pub async fn wake_pending(shard: &Shard, limit: i32) -> Result<i64, ShardError> {
    let row = exec::query_one(shard, sql::CHILD_WAKE_PENDING, &[(&limit, Type::INT4)]).await?;
    Ok(row.get("settled"))
}
