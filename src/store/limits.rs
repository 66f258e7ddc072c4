//! Queue limits (`shardq limit`): written on every shard, permits leased
//! from the first (see migrations/0021_queue_limits.sql).

use super::exec;
use super::sql;
use crate::shards::{Shard, ShardError};
use tokio_postgres::types::Type;

/// A queue's limits as one shard records them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LimitRow {
    /// Queue.
    pub queue: String,
    /// Jobs of the queue running at once across the fleet; `None`: none.
    pub concurrency: Option<i32>,
    /// Jobs of the queue started per period across the fleet; `None`: none.
    pub rate: Option<Rate>,
    /// Jobs of each group of the queue running at once; `None`: none.
    pub group_concurrency: Option<i32>,
    /// Jobs of each group of the queue started per period; `None`: none.
    pub group_rate: Option<Rate>,
    /// Orders the writes: the newest wins where shards disagree.
    pub revision: i64,
}

/// At most `count` jobs started per `period_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Rate {
    /// Starts per period.
    pub count: i32,
    /// The period, in milliseconds.
    pub period_ms: i32,
}

impl Rate {
    fn from_row(row: &tokio_postgres::Row) -> Option<Rate> {
        Self::from_columns(row, "rate_count", "rate_period_ms")
    }

    fn from_columns(row: &tokio_postgres::Row, count: &str, period_ms: &str) -> Option<Rate> {
        Some(Rate {
            count: row.get::<_, Option<i32>>(count)?,
            period_ms: row.get::<_, Option<i32>>(period_ms)?,
        })
    }
}

/// Permits of one queue now leased (home shard).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PermitsInUse {
    /// Queue.
    pub queue: String,
    /// Permits held by unexpired leases.
    pub permits: i64,
    /// Processes holding at least one.
    pub holders: i64,
}

/// A lease's answer for one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// Queue.
    pub queue: String,
    /// Its concurrency limit; `None`: not limited (the grant is what was asked).
    pub concurrency: Option<i32>,
    /// Permits the holder holds now.
    pub granted: i32,
    /// Its rate, if any.
    pub rate: Option<Rate>,
}

/// Writes `row` on the home shard under the next revision there, at least
/// `at_least`; returns that revision (`row.revision` is not used).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe in effect (one statement; a repeat writes the same limits
/// under a newer revision).
pub async fn set_home(shard: &Shard, row: &LimitRow, at_least: i64) -> Result<i64, ShardError> {
    let values = Values::of(row);
    let written = exec::query_one(shard, sql::LIMIT_SET_HOME, &values.params(&at_least)).await?;
    Ok(written.get("revision"))
}

/// Moves `queue`'s revision on the home shard from `from` to `to` unless a
/// later change replaced the one written under `from`; returns whether it
/// moved.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (one statement).
pub async fn raise_home(
    shard: &Shard,
    queue: &str,
    from: i64,
    to: i64,
) -> Result<bool, ShardError> {
    let moved = exec::query_opt(
        shard,
        sql::LIMIT_RAISE_HOME,
        &[(&queue, Type::TEXT), (&from, Type::INT8), (&to, Type::INT8)],
    )
    .await?;
    Ok(moved.is_some())
}

/// Writes `row` on `shard` unless the shard records a newer revision.
/// Returns whether it was written.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (one statement; a repeat with the same revision is a no-op).
pub async fn set(shard: &Shard, row: &LimitRow) -> Result<bool, ShardError> {
    let values = Values::of(row);
    let n = exec::execute(shard, sql::LIMIT_SET, &values.params(&row.revision)).await?;
    Ok(n > 0)
}

/// A row's columns as the upserts' parameters $1 to $7.
struct Values<'a> {
    row: &'a LimitRow,
    rate: [Option<i32>; 2],
    group_rate: [Option<i32>; 2],
}

impl<'a> Values<'a> {
    fn of(row: &'a LimitRow) -> Values<'a> {
        let split = |r: Option<Rate>| [r.map(|r| r.count), r.map(|r| r.period_ms)];
        Values {
            row,
            rate: split(row.rate),
            group_rate: split(row.group_rate),
        }
    }

    /// $1 to $7, then `revision` as $8.
    fn params<'p>(&'p self, revision: &'p i64) -> [super::sql::Param<'p>; 8] {
        [
            (&self.row.queue, Type::TEXT),
            (&self.row.concurrency, Type::INT4),
            (&self.rate[0], Type::INT4),
            (&self.rate[1], Type::INT4),
            (&self.row.group_concurrency, Type::INT4),
            (&self.group_rate[0], Type::INT4),
            (&self.group_rate[1], Type::INT4),
            (revision, Type::INT8),
        ]
    }
}

/// The revision of `queue`'s limits on `shard` (`None`: no row).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn revision(shard: &Shard, queue: &str) -> Result<Option<i64>, ShardError> {
    let row = exec::query_opt(shard, sql::LIMIT_REVISION, &[(&queue, Type::TEXT)]).await?;
    Ok(row.map(|r| r.get("revision")))
}

/// Every queue's limits as `shard` records them, by queue.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn read(shard: &Shard) -> Result<Vec<LimitRow>, ShardError> {
    let rows = exec::query(shard, sql::LIMITS_READ, &[]).await?;
    Ok(rows
        .iter()
        .map(|r| LimitRow {
            queue: r.get("queue"),
            concurrency: r.get("concurrency"),
            rate: Rate::from_row(r),
            group_concurrency: r.get("group_concurrency"),
            group_rate: Rate::from_columns(r, "group_rate_count", "group_rate_period_ms"),
            revision: r.get("revision"),
        })
        .collect())
}

/// Permits leased now per queue, on the limits' home shard.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn in_use(shard: &Shard) -> Result<Vec<PermitsInUse>, ShardError> {
    let rows = exec::query(shard, sql::LIMIT_PERMITS_IN_USE, &[]).await?;
    Ok(rows
        .iter()
        .map(|r| PermitsInUse {
            queue: r.get("queue"),
            permits: r.get("permits"),
            holders: r.get("holders"),
        })
        .collect())
}

/// Sets the permits `holder` holds for each of `wants` (queue, permits
/// wanted) for `lease_ms`, within each queue's limit (on the home shard).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one statement; a lease set and not heard of is set again
/// by the next call, and lapses meanwhile.
pub async fn lease(
    shard: &Shard,
    holder: &str,
    wants: &[(String, i32)],
    lease_ms: i32,
) -> Result<Vec<Granted>, ShardError> {
    let queues: Vec<&str> = wants.iter().map(|(q, _)| q.as_str()).collect();
    let counts: Vec<i32> = wants.iter().map(|(_, n)| *n).collect();
    let rows = exec::query(
        shard,
        sql::LIMIT_LEASE_PERMITS,
        &[
            (&holder, Type::TEXT),
            (&queues, Type::TEXT_ARRAY),
            (&counts, Type::INT4_ARRAY),
            (&lease_ms, Type::INT4),
        ],
    )
    .await?;
    Ok(rows
        .iter()
        .map(|r| Granted {
            queue: r.get("queue"),
            concurrency: r.get("concurrency"),
            granted: r.get("granted"),
            rate: Rate::from_row(r),
        })
        .collect())
}

/// Takes up to `want` starts of `queue` from its rate (on the home shard);
/// a negative `want` gives that many unused ones back. `None` when the
/// queue has no rate.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Not idempotent: a take whose answer is lost loses its starts (the rate
/// is then lower for a moment, never higher).
pub async fn take_starts(shard: &Shard, queue: &str, want: i32) -> Result<Option<i32>, ShardError> {
    let row = exec::query_one(
        shard,
        sql::LIMIT_TAKE_STARTS,
        &[(&queue, Type::TEXT), (&want, Type::INT4)],
    )
    .await?;
    Ok(row.get("starts"))
}
