//! The durable state of periodic jobs: one row per schedule in
//! `shardq_schedules`, on the shard the schedule's name routes to, holding
//! the latest tick handled. See `sql::SCHEDULE_TICK` for why one tick is
//! enqueued once however many processes run it.

use super::exec;
use super::sql::{self, Param};
use crate::job::{JobId, NewJob};
use crate::schedule::due::LATE_TICK_GRACE;
use crate::shards::{Shard, ShardError};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use tokio_postgres::types::Type;

/// One tick of one schedule.
#[derive(Debug, Clone, Copy)]
pub struct Tick<'a> {
    /// The schedule's name.
    pub name: &'a str,
    /// The tick.
    pub at: DateTime<Utc>,
    /// The routing key of the tick's job (the schedule's shard key).
    pub shard_key: i32,
    /// The tick's job (its deduplication id names the tick).
    pub job: &'a NewJob,
    /// Its attempt limit.
    pub max_attempts: i32,
    /// Whether to enqueue the job when `last_tick` moves (false: a missed
    /// tick under the `skip` policy, recorded only).
    pub enqueue: bool,
}

/// What a tick statement did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickOutcome {
    /// The tick was not ripe by the database's clock (in the future, or for a
    /// skip not older than [`LATE_TICK_GRACE`]): nothing was written; try it
    /// again later.
    pub not_yet: bool,
    /// `last_tick` moved forward to this tick (no other process had got there).
    pub advanced: bool,
    /// The job it enqueued.
    pub job: Option<JobId>,
    /// The shard does not hold the schedule's key (its range moved, or is
    /// moving in): nothing was written; find the schedule's shard again.
    pub moved: bool,
}

/// A schedule's recorded state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastTick {
    /// The latest tick handled.
    pub at: DateTime<Utc>,
    /// When it was handled.
    pub updated_at: DateTime<Utc>,
}

/// Records schedule `name` with last tick `at` unless some process did
/// already. Returns whether this call did.
///
/// # Errors
///
/// [`ShardError`] when the statement fails.
///
/// # Cancel safety
///
/// Not cancel safe: the row may be written; calling it again is harmless.
pub async fn register(shard: &Shard, name: &str, at: DateTime<Utc>) -> Result<bool, ShardError> {
    let row = exec::query_opt(
        shard,
        sql::SCHEDULE_REGISTER,
        &[(&name, Type::TEXT), (&at, Type::TIMESTAMPTZ)],
    )
    .await?;
    Ok(row.is_some())
}

/// The recorded last tick of schedule `name`, if any.
///
/// # Errors
///
/// [`ShardError`] when the statement fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn last_tick(shard: &Shard, name: &str) -> Result<Option<LastTick>, ShardError> {
    let row = exec::query_opt(shard, sql::SCHEDULE_LAST_TICK, &[(&name, Type::TEXT)]).await?;
    Ok(row.map(|r| LastTick {
        at: r.get("last_tick"),
        updated_at: r.get("updated_at"),
    }))
}

/// The recorded last ticks of the schedules `names` on `shard`, by name.
///
/// # Errors
///
/// [`ShardError`] when the statement fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn last_ticks(
    shard: &Shard,
    names: &[&str],
) -> Result<HashMap<String, LastTick>, ShardError> {
    let rows = exec::query(
        shard,
        sql::SCHEDULE_LAST_TICKS,
        &[(&names, Type::TEXT_ARRAY)],
    )
    .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let last = LastTick {
                at: r.get("last_tick"),
                updated_at: r.get("updated_at"),
            };
            (r.get("name"), last)
        })
        .collect())
}

/// The shard's clock now: what judges which ticks are due.
///
/// # Errors
///
/// [`ShardError`] when the statement fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn clock(shard: &Shard) -> Result<DateTime<Utc>, ShardError> {
    let row = exec::query_one(shard, sql::SCHEDULE_CLOCK, &[]).await?;
    Ok(row.get("now"))
}

/// Runs one tick on `shard`, in one statement (see `sql::SCHEDULE_TICK`):
/// moves the schedule's `last_tick` forward to the tick if it is older and
/// ripe by the database's clock (not in the future; a skipped tick older
/// than [`LATE_TICK_GRACE`]) and, only then, enqueues the tick's job.
///
/// # Errors
///
/// [`ShardError`] when the statement fails (then nothing was written, unless
/// the failure was a lost reply after the commit; running the tick again is
/// harmless either way).
///
/// # Cancel safety
///
/// Not cancel safe: dropped after it was sent, the tick may be written;
/// running it again enqueues nothing more.
pub async fn tick(shard: &Shard, tick: Tick<'_>) -> Result<TickOutcome, ShardError> {
    let p = TickParams::of(&tick);
    let row = exec::query_one(shard, sql::SCHEDULE_TICK, &p.params()).await?;
    Ok(p.outcome(&row))
}

/// [`tick`] on a connection or transaction of the caller's (`client` reaches
/// the schedule's shard): the tick counts only if that transaction commits.
/// For tests and tools that drive two ticks step by step.
///
/// # Errors
///
/// The statement's error.
///
/// # Cancel safety
///
/// As the caller's transaction: nothing is kept unless it commits.
#[cfg(feature = "internal")]
pub async fn tick_in<C: tokio_postgres::GenericClient>(
    client: &C,
    tick: Tick<'_>,
) -> Result<TickOutcome, tokio_postgres::Error> {
    let p = TickParams::of(&tick);
    let rows = client.query_typed(sql::SCHEDULE_TICK, &p.params()).await?;
    let row = rows.first().expect("the tick statement returns one row");
    Ok(p.outcome(row))
}

/// The bind parameters of [`sql::SCHEDULE_TICK`].
struct TickParams<'a> {
    tick: &'a Tick<'a>,
    dedup_id: &'a str,
    /// [`LATE_TICK_GRACE`] in milliseconds.
    grace_ms: i64,
}

impl<'a> TickParams<'a> {
    fn of(tick: &'a Tick<'a>) -> TickParams<'a> {
        TickParams {
            tick,
            dedup_id: tick.job.dedup_id.as_deref().unwrap_or(tick.name),
            grace_ms: LATE_TICK_GRACE.num_milliseconds(),
        }
    }

    fn params(&self) -> [Param<'_>; 10] {
        let t = self.tick;
        [
            (&t.name, Type::TEXT),
            (&t.at, Type::TIMESTAMPTZ),
            (&t.shard_key, Type::INT4),
            (&t.job.queue, Type::TEXT),
            (&t.job.handler, Type::TEXT),
            (&t.job.payload, Type::JSONB),
            (&t.max_attempts, Type::INT4),
            (&self.dedup_id, Type::TEXT),
            (&t.enqueue, Type::BOOL),
            (&self.grace_ms, Type::INT8),
        ]
    }

    fn outcome(&self, row: &tokio_postgres::Row) -> TickOutcome {
        let id: Option<i64> = row.get("job_id");
        TickOutcome {
            not_yet: !row.get::<_, bool>("ripe"),
            advanced: row.get("advanced"),
            job: id.map(|id| JobId {
                shard_key: self.tick.shard_key,
                id,
            }),
            moved: !row.get::<_, bool>("owned"),
        }
    }
}

/// `shardq reshard`: copies the state of the schedules whose key is in
/// `range` from `from` to `to` (run while the range is closed on `to`).
/// Returns how many.
///
/// # Errors
///
/// [`ShardError`] when either shard fails.
pub async fn copy_range(
    from: &Shard,
    to: &Shard,
    (first, end): (i32, i32),
) -> Result<usize, ShardError> {
    let rows = exec::query(
        from,
        sql::SCHEDULE_ROWS_OF_RANGE,
        &[(&first, Type::INT4), (&end, Type::INT4)],
    )
    .await?;
    for r in &rows {
        let name: String = r.get("name");
        let last: DateTime<Utc> = r.get("last_tick");
        let updated: DateTime<Utc> = r.get("updated_at");
        exec::execute(
            to,
            sql::SCHEDULE_ROW_COPY,
            &[
                (&name, Type::TEXT),
                (&last, Type::TIMESTAMPTZ),
                (&updated, Type::TIMESTAMPTZ),
            ],
        )
        .await?;
    }
    Ok(rows.len())
}
