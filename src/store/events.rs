//! Workflow events: a set_event step that writes a workflow's event with
//! its step record, and the read of an event.

use super::exec;
use super::sql;
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use serde_json::Value;
use tokio_postgres::types::Type;

/// A set_event step of a workflow.
#[derive(Debug, Clone, Copy)]
pub struct SetEvent<'a> {
    /// The workflow (job).
    pub id: JobId,
    /// The step's name.
    pub name: &'a str,
    /// The event's key.
    pub key: &'a str,
    /// Its value.
    pub value: &'a Value,
    /// The worker holding the workflow.
    pub owner: &'a str,
    /// The fence of its claim.
    pub fence: i64,
}

/// What a set_event step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventSet {
    /// The event is set: by this call, or by an earlier run of the step
    /// (a replay writes nothing).
    Set,
    /// The workflow's cancellation was asked: nothing written.
    Cancelled,
    /// This claim no longer holds the workflow (its lease was lost):
    /// nothing written.
    NotHeld,
}

/// Records set_event step `p.name` and writes the event, both in one
/// statement, once ([`sql::EVENT_SET`]).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe in effect: a repeat finds the step recorded and writes
/// nothing.
pub async fn set(shard: &Shard, p: SetEvent<'_>) -> Result<EventSet, ShardError> {
    let row = exec::query_one(
        shard,
        sql::EVENT_SET,
        &[
            (&p.id.shard_key, Type::INT4),
            (&p.id.id, Type::INT8),
            (&p.name, Type::TEXT),
            (&p.key, Type::TEXT),
            (p.value, Type::JSONB),
            (&p.owner, Type::TEXT),
            (&p.fence, Type::INT8),
        ],
    )
    .await?;
    Ok(if row.get::<_, bool>("owned") {
        EventSet::Set
    } else if row.get::<_, bool>("cancelled") {
        EventSet::Cancelled
    } else {
        EventSet::NotHeld
    })
}

/// Event `key` of workflow `id` on `shard` ([`sql::EVENT_GET`]): `None`
/// when the workflow is not on this shard, `Some(None)` while the key is
/// not set.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn get(shard: &Shard, id: JobId, key: &str) -> Result<Option<Option<Value>>, ShardError> {
    let row = exec::query_opt(
        shard,
        sql::EVENT_GET,
        &[
            (&id.shard_key, Type::INT4),
            (&id.id, Type::INT8),
            (&key, Type::TEXT),
        ],
    )
    .await?;
    Ok(row.map(|r| r.get("value")))
}
