//! Writing new jobs.

use super::super::exec;
use super::super::sql::{self, Param};
use super::ids::job_id;
use crate::job::{JobId, NewJob};
use crate::shards::{Shard, ShardError};
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

/// Rows per insert statement: bounds the statement's size and memory.
const INSERT_CHUNK: usize = 5_000;

/// A job to write: the job, its routing key and its attempt limit resolved.
#[derive(Debug, Clone, Copy)]
pub struct NewRow<'a> {
    /// The routing key (its shard is the one written to).
    pub shard_key: i32,
    /// The job.
    pub job: &'a NewJob,
    /// Its attempt limit (the job's own or the configured default).
    pub max_attempts: i32,
}

/// Inserts `rows` on `shard`, in statements of up to 5,000. Returns their
/// ids in input order.
///
/// # Errors
///
/// [`ShardError`] when a statement fails; the chunks before it are written.
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future may leave some chunks written.
#[cfg(feature = "internal")]
pub async fn insert_many(shard: &Shard, rows: &[NewRow<'_>]) -> Result<Vec<JobId>, ShardError> {
    let mut out = Vec::with_capacity(rows.len());
    for chunk in rows.chunks(INSERT_CHUNK) {
        let columns = Columns::of(chunk);
        let mut params = columns.params().to_vec();
        params.push((&columns.groups, Type::TEXT_ARRAY));
        params.push((&columns.timeouts, Type::INT8_ARRAY));
        let ids = exec::query(shard, sql::JOB_INSERT_MANY, &params).await?;
        out.extend(chunk.iter().zip(ids).map(|(row, id)| JobId {
            shard_key: row.shard_key,
            id: id.get("id"),
        }));
    }
    Ok(out)
}

/// Takes `n` job ids on `shard` for [`insert_many_as`] and
/// [`insert_dedup_as`], ascending: ids taken by a call that returned before
/// another began are smaller than that one's. An id taken and never used is
/// a harmless gap.
///
/// # Errors
///
/// [`ShardError`] when the statement fails (taking ids again is harmless).
///
/// # Cancel safety
///
/// Cancel safe: at worst some ids go unused.
pub async fn reserve_ids(shard: &Shard, n: usize) -> Result<Vec<i64>, ShardError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let n = i32::try_from(n).expect("fewer than 2^31 jobs in one call");
    let row = exec::query_one(shard, sql::JOB_RESERVE_IDS, &[(&n, Type::INT4)]).await?;
    let mut ids: Vec<i64> = row.get("ids");
    ids.sort_unstable();
    Ok(ids)
}

/// Inserts `rows` on `shard` with the ids `ids` (one per row, from
/// [`reserve_ids`] on this shard), in statements of up to 5,000. `again`:
/// an earlier call with these rows may have written some of them (it failed,
/// or its reply never came); then a row whose id exists is skipped, so each
/// job is written exactly once. Returns how many rows this call wrote.
///
/// `epoch`: the epoch of the shard map the rows were routed by (`None`:
/// the shard's current one); each statement first checks it and that every
/// row's key is on this shard at that epoch.
///
/// # Errors
///
/// [`ShardError`] when a statement fails; the chunks before it are written.
/// SQLSTATE SQ004 ([`crate::store::ErrorKind::StaleMap`]): `epoch` is not
/// the shard's current one; that statement wrote nothing.
/// Without `again`, a row that exists already fails its chunk (unique
/// violation): call it with `again` after any failure.
///
/// # Cancel safety
///
/// Not cancel safe (some chunks may be written), but safe to call again with
/// `again`.
pub async fn insert_many_as(
    shard: &Shard,
    rows: &[NewRow<'_>],
    ids: &[i64],
    epoch: Option<i32>,
    again: bool,
) -> Result<u64, ShardError> {
    assert_eq!(rows.len(), ids.len(), "one id per row");
    let statement = if again {
        sql::JOB_INSERT_MANY_AGAIN
    } else {
        sql::JOB_INSERT_MANY_AS
    };
    let mut written = 0;
    for (chunk, ids) in rows.chunks(INSERT_CHUNK).zip(ids.chunks(INSERT_CHUNK)) {
        let columns = Columns::of(chunk);
        let ids = ids.to_vec();
        let mut params = columns.params_with_ids(&ids).to_vec();
        params.push((&epoch, Type::INT4));
        params.push((&columns.groups, Type::TEXT_ARRAY));
        params.push((&columns.timeouts, Type::INT8_ARRAY));
        written += exec::execute(shard, statement, &params).await?;
    }
    Ok(written)
}

/// Inserts `row` inside the caller's own transaction `tx` (any connection to
/// the shard it routes to), so it exists only if that transaction commits.
/// `epoch`: as [`insert_many_as`].
///
/// # Errors
///
/// The statement's error (SQLSTATE SQ004: the map `epoch` is old; SQ001:
/// the row's key is not on this shard).
///
/// # Cancel safety
///
/// As the caller's transaction: nothing is kept unless it commits.
pub async fn insert_in<C: GenericClient>(
    tx: &C,
    row: NewRow<'_>,
    epoch: Option<i32>,
) -> Result<JobId, tokio_postgres::Error> {
    let columns = Columns::of(std::slice::from_ref(&row));
    let mut params = columns.params().to_vec();
    params.push((&epoch, Type::INT4));
    params.push((&columns.groups, Type::TEXT_ARRAY));
    params.push((&columns.timeouts, Type::INT8_ARRAY));
    let written = tx.query_typed(sql::JOB_INSERT_MANY_FENCED, &params).await?;
    let id = written
        .first()
        .map(|r| r.get("id"))
        .expect("an insert returns its id");
    Ok(JobId {
        shard_key: row.shard_key,
        id,
    })
}

/// Inserts `row` with deduplication id `dedup_id`, unless an unfinished job
/// of its queue has that id. Returns the new id, or `None`. The same insert
/// as [`insert_dedup_as`], with an id taken first (a fresh id conflicts with
/// no row, so only the deduplication id can refuse it).
///
/// # Errors
///
/// [`ShardError`] when a statement fails.
///
/// # Cancel safety
///
/// Not cancel safe: the job may be written.
#[cfg(feature = "internal")]
pub async fn insert_dedup(
    shard: &Shard,
    row: NewRow<'_>,
    dedup_id: &str,
) -> Result<Option<JobId>, ShardError> {
    let id = reserve_ids(shard, 1).await?[0];
    let written = insert_dedup_as(shard, row, dedup_id, id, None).await?;
    Ok(written.then_some(JobId {
        shard_key: row.shard_key,
        id,
    }))
}

/// Inserts `row` with deduplication id `dedup_id` as job `id` (from
/// [`reserve_ids`] on this shard), unless job `id` exists already or an
/// unfinished job of its queue has that deduplication id. Returns whether
/// this call wrote it; when it did not, [`super::exists`] on `id` tells a
/// retry of an earlier write (it is there) from a duplicate. `epoch`: as
/// [`insert_many_as`].
///
/// # Errors
///
/// [`ShardError`] when the statement fails (SQ004: as [`insert_many_as`]).
///
/// # Cancel safety
///
/// Not cancel safe (the job may be written), but safe to call again.
pub async fn insert_dedup_as(
    shard: &Shard,
    row: NewRow<'_>,
    dedup_id: &str,
    id: i64,
    epoch: Option<i32>,
) -> Result<bool, ShardError> {
    let delay_ms = row.job.delay.as_millis() as i64;
    let mut params = dedup_params(&row, &delay_ms, &dedup_id).to_vec();
    params.push((&id, Type::INT8));
    params.push((&epoch, Type::INT4));
    params.push((&row.job.group, Type::TEXT));
    let timeout_ms = row.job.timeout_ms();
    params.push((&timeout_ms, Type::INT8));
    let inserted = exec::query_opt(shard, sql::JOB_INSERT_DEDUP_AS, &params).await?;
    Ok(inserted.is_some())
}

/// The unfinished job of `queue` with deduplication id `dedup_id`.
///
/// # Errors
///
/// [`ShardError`] when the statement fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn find_dedup(
    shard: &Shard,
    queue: &str,
    dedup_id: &str,
) -> Result<Option<JobId>, ShardError> {
    let row = exec::query_opt(
        shard,
        sql::JOB_FIND_DEDUP,
        &[(&queue, Type::TEXT), (&dedup_id, Type::TEXT)],
    )
    .await?;
    Ok(row.as_ref().map(job_id))
}

/// The parameters $1..$9 of [`sql::JOB_INSERT_DEDUP_AS`] (the id is $10,
/// the epoch $11).
fn dedup_params<'a>(row: &'a NewRow<'_>, delay_ms: &'a i64, dedup_id: &'a &str) -> [Param<'a>; 9] {
    let j = row.job;
    [
        (&row.shard_key, Type::INT4),
        (&j.queue, Type::TEXT),
        (&j.handler, Type::TEXT),
        (&j.ordering_key, Type::TEXT),
        (&j.priority, Type::INT4),
        (&j.payload, Type::JSONB),
        (delay_ms, Type::INT8),
        (&row.max_attempts, Type::INT4),
        (dedup_id, Type::TEXT),
    ]
}

/// The columns of [`sql::JOB_INSERT_MANY`] for some rows (and, after the
/// ids, of [`sql::JOB_INSERT_MANY_AS`]).
struct Columns<'a> {
    keys: Vec<i32>,
    queues: Vec<&'a str>,
    handlers: Vec<&'a str>,
    ordering: Vec<Option<&'a str>>,
    priorities: Vec<i32>,
    payloads: Vec<&'a serde_json::Value>,
    delays: Vec<i64>,
    attempts: Vec<i32>,
    groups: Vec<Option<&'a str>>,
    /// NULL for a job without a timeout: all a non-user pays.
    timeouts: Vec<Option<i64>>,
}

impl<'a> Columns<'a> {
    fn of(rows: &[NewRow<'a>]) -> Columns<'a> {
        Columns {
            keys: rows.iter().map(|r| r.shard_key).collect(),
            queues: rows.iter().map(|r| r.job.queue.as_str()).collect(),
            handlers: rows.iter().map(|r| r.job.handler.as_str()).collect(),
            ordering: rows.iter().map(|r| r.job.ordering_key.as_deref()).collect(),
            priorities: rows.iter().map(|r| r.job.priority).collect(),
            payloads: rows.iter().map(|r| &r.job.payload).collect(),
            delays: rows
                .iter()
                .map(|r| r.job.delay.as_millis() as i64)
                .collect(),
            attempts: rows.iter().map(|r| r.max_attempts).collect(),
            groups: rows.iter().map(|r| r.job.group.as_deref()).collect(),
            timeouts: rows.iter().map(|r| r.job.timeout_ms()).collect(),
        }
    }

    /// The parameters of [`sql::JOB_INSERT_MANY_AS`] and
    /// [`sql::JOB_INSERT_MANY_AGAIN`]: the ids first, then [`Columns::params`].
    fn params_with_ids<'p>(&'p self, ids: &'p Vec<i64>) -> [Param<'p>; 9] {
        let [keys, queues, handlers, ordering, priorities, payloads, delays, attempts] =
            self.params();
        [
            (ids, Type::INT8_ARRAY),
            keys,
            queues,
            handlers,
            ordering,
            priorities,
            payloads,
            delays,
            attempts,
        ]
    }

    fn params(&self) -> [Param<'_>; 8] {
        [
            (&self.keys, Type::INT4_ARRAY),
            (&self.queues, Type::TEXT_ARRAY),
            (&self.handlers, Type::TEXT_ARRAY),
            (&self.ordering, Type::TEXT_ARRAY),
            (&self.priorities, Type::INT4_ARRAY),
            (&self.payloads, Type::JSONB_ARRAY),
            (&self.delays, Type::INT8_ARRAY),
            (&self.attempts, Type::INT4_ARRAY),
        ]
    }
}
