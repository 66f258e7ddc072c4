//! Per-shard upkeep, each gated by its own advisory lock so that one process
//! at a time does it on a shard: recovery of expired leases, promotion of due
//! scheduled jobs, deletion of old finished jobs.

use super::exec;
use super::locks;
use super::sql::{self, Param};
use super::JobStatus;
use crate::shards::{Shard, ShardError};
use std::time::{Duration, SystemTime};
use tokio_postgres::types::Type;
use tokio_postgres::Row;

/// What one recovery pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Jobs back in the queue.
    pub requeued: u64,
    /// Jobs past their attempt limit, now dead.
    pub dead: u64,
    /// Jobs whose cancellation was asked, now cancelled.
    pub cancelled: u64,
}

/// Distinct key locks one upkeep statement takes at most. Every advisory
/// lock held is an entry in the server's shared lock table until commit, and
/// that table holds `max_locks_per_transaction` (64) x `max_connections`
/// (100) entries for the whole server by default: a pass that locked
/// thousands of keys would leave too few for the claims and completions
/// running beside it (`out of shared memory`, 53200). The jobs of further
/// keys come back in the next pass.
pub const KEY_LOCKS_PER_STATEMENT: i64 = 1_000;

/// Returns up to `limit` jobs with expired leases on `shard` to the queue
/// (attempt count kept), unless another process is doing it. Keyed jobs go
/// back behind their key, under its lock, and free keys are released. A
/// job whose key lock is held now (a frozen worker's open transaction, say)
/// or whose row is being written is skipped, left for a later pass: one
/// stuck key never stops the recovery of the others.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one transaction, committed or not.
pub async fn recover_expired(shard: &Shard, limit: i64) -> Result<Recovered, ShardError> {
    Ok(recover(shard, limit, RecoveryStart::Oldest)
        .await?
        .recovered)
}

/// Where a recovery pass starts looking for expired leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryStart {
    /// At the oldest lease: every expired one (a full pass).
    Oldest,
    /// At the shard's lease floor (migration 51, [`move_lease_floor`]): no
    /// running job's lease ends before it. While a long
    /// transaction holds the xmin horizon, the lease index keeps an
    /// expired entry for every job finished since; a pass from the floor
    /// walks only those of the last seconds.
    LeaseFloor,
    /// At this time: the caller vouches that no lease before it is left.
    #[cfg_attr(not(feature = "internal"), allow(dead_code))]
    At(SystemTime),
}

/// How old a candidate for the lease floor must be before a later move
/// makes it the floor (and notes the next): the floor trails the moves by
/// about this much, and is written about this often.
pub const LEASE_FLOOR_STEP: Duration = Duration::from_secs(2);

/// What one recovery pass did, and where the next may start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryPass {
    /// The jobs it returned.
    pub recovered: Recovered,
    /// The database's time of the pass; `None` when another process had
    /// the recovery's lock (nothing was looked at).
    pub at: Option<SystemTime>,
    /// It found fewer expired leases than its limit: none is left at or
    /// after where it started, except those it skipped.
    pub caught_up: bool,
    /// The earliest expired lease it found and left (its key was busy).
    pub oldest_left: Option<SystemTime>,
}

/// One recovery pass of up to `limit` jobs from `start` (the lease floor
/// moves apart: [`move_lease_floor`]).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one transaction, committed or not.
pub async fn recover(
    shard: &Shard,
    limit: i64,
    start: RecoveryStart,
) -> Result<RecoveryPass, ShardError> {
    shard
        .within(async move {
            let mut client = shard.lend().await?;
            let recovered = recover_on(shard, &mut client, limit, start).await;
            client.settle();
            recovered
        })
        .await
}

/// [`recover`] on a lent connection.
///
/// Between its statements, without the locks it holds: enqueue (adds jobs,
/// changes none of these), any writer of a key whose lock the try did not
/// get, whose jobs this pass then leaves alone, and claims and extensions,
/// whose leases end after the floor (migration 51). The found rows are
/// locked, so no completion or extension changes them in between; another
/// pass that tries the recovery's lock meanwhile skips its turn.
async fn recover_on(
    shard: &Shard,
    client: &mut deadpool_postgres::Client,
    limit: i64,
    start: RecoveryStart,
) -> Result<RecoveryPass, ShardError> {
    let err = |e| shard.query_error(e);
    let tx = client.transaction().await.map_err(err)?;
    let gate = tx
        .query_typed(
            sql::RECOVERY_GATE,
            &[
                (&locks::maintenance_class(), Type::INT4),
                (&locks::RECOVERY_SLOT, Type::INT4),
            ],
        )
        .await
        .map_err(err)?;
    let Some(gate) = gate.first().filter(|row| row.get::<_, bool>("got")) else {
        return Ok(RecoveryPass::default());
    };
    let at: SystemTime = gate.get("at");
    let floor: Option<SystemTime> = gate.get("floor_at");
    let since = match start {
        RecoveryStart::Oldest => None,
        RecoveryStart::LeaseFloor => floor,
        RecoveryStart::At(since) => Some(since),
    };
    let expired = tx
        .query_typed(
            sql::JOB_FIND_EXPIRED,
            &[(&limit, Type::INT8), (&since, Type::TIMESTAMPTZ)],
        )
        .await
        .map_err(err)?;
    let rows = return_lost_in(&tx, &expired, sql::JOB_RECOVER_EXPIRED, &[])
        .await
        .map_err(err)?;
    let caught_up = (expired.len() as i64) < limit;
    let returned: std::collections::HashSet<i64> = rows.iter().map(|r| r.get("id")).collect();
    let pass = RecoveryPass {
        recovered: Recovered::tally(&rows),
        at: Some(at),
        caught_up,
        oldest_left: expired
            .iter()
            .filter(|r| !returned.contains(&r.get::<_, i64>("id")))
            .map(|r| r.get("lease_expires_at"))
            .min(),
    };
    tx.commit().await.map_err(err)?;
    Ok(pass)
}

/// Moves `shard`'s lease floor ([`sql::LEASE_FLOOR_MOVE`]), unless another
/// process is doing it: its own transaction, apart from lease recovery
/// (the floor's safety does not depend on what recovery did; recovery
/// only lets it rise past leases that expired). Returns the floor after
/// it (`None`: none yet, or another process had the lock).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one transaction, committed or not.
pub async fn move_lease_floor(shard: &Shard) -> Result<Option<SystemTime>, ShardError> {
    shard
        .within(async move {
            let mut client = shard.lend().await?;
            let moved = move_lease_floor_on(shard, &mut client).await;
            client.settle();
            moved
        })
        .await
}

/// [`move_lease_floor`] on a lent connection. Between its statements,
/// without the lock it holds: claims, extensions and completions, which
/// change the running rows the move reads in one snapshot; no other move
/// (the lock).
async fn move_lease_floor_on(
    shard: &Shard,
    client: &mut deadpool_postgres::Client,
) -> Result<Option<SystemTime>, ShardError> {
    let err = |e| shard.query_error(e);
    let tx = client.transaction().await.map_err(err)?;
    let gate = tx
        .query_typed(
            sql::UPKEEP_GATE_AT,
            &[
                (&locks::maintenance_class(), Type::INT4),
                (&locks::LEASE_FLOOR_SLOT, Type::INT4),
            ],
        )
        .await
        .map_err(err)?;
    if !gate.first().is_some_and(|row| row.get::<_, bool>("got")) {
        return Ok(None);
    }
    let step = LEASE_FLOOR_STEP.as_millis() as i64;
    let moved = tx
        .query_typed(sql::LEASE_FLOOR_MOVE, &[(&step, Type::INT8)])
        .await
        .map_err(err)?;
    tx.commit().await.map_err(err)?;
    Ok(moved.first().and_then(|row| row.get("floor_at")))
}

impl Recovered {
    /// Counts the new statuses (`status` column) of returned jobs.
    pub(crate) fn tally(rows: &[Row]) -> Recovered {
        let mut out = Recovered::default();
        for row in rows {
            match JobStatus::from_column(row.get("status")) {
                JobStatus::Queued | JobStatus::Waiting => out.requeued += 1,
                JobStatus::Dead => out.dead += 1,
                _ => out.cancelled += 1,
            }
        }
        out
    }
}

/// Inside `tx`: tries the key locks of the `found` jobs (rows with
/// `shard_key` and `id`, locked by the caller), runs `statement` on those it
/// may change ($1 shard keys, $2 ids, then `extra` from $3 on), and releases
/// their keys (a free key's lowest waiting job is queued). Returns
/// `statement`'s rows. Never waits for a key lock: jobs of held keys are
/// left as they are.
pub(crate) async fn return_lost_in(
    tx: &deadpool_postgres::Transaction<'_>,
    found: &[Row],
    statement: &str,
    extra: &[Param<'_>],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<i32> = found.iter().map(|r| r.get("shard_key")).collect();
    let ids: Vec<i64> = found.iter().map(|r| r.get("id")).collect();
    let free = tx
        .query_typed(
            sql::KEYS_TRY_LOCK,
            &[
                (&keys, Type::INT4_ARRAY),
                (&ids, Type::INT8_ARRAY),
                (&KEY_LOCKS_PER_STATEMENT, Type::INT8),
            ],
        )
        .await?;
    if free.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<i32> = free.iter().map(|r| r.get("shard_key")).collect();
    let ids: Vec<i64> = free.iter().map(|r| r.get("id")).collect();
    let mut params: Vec<Param> = vec![(&keys, Type::INT4_ARRAY), (&ids, Type::INT8_ARRAY)];
    params.extend_from_slice(extra);
    let rows = tx.query_typed(statement, &params).await?;
    let job_ids: [Param; 2] = [(&keys, Type::INT4_ARRAY), (&ids, Type::INT8_ARRAY)];
    tx.query_typed(sql::KEYS_PROMOTE, &job_ids).await?;
    Ok(rows)
}

/// Makes up to `limit` due scheduled jobs on `shard` ready, unless another
/// process is doing it. Returns how many. A keyed job is made ready under
/// its key's lock, tried: a key held now is promoted by a later pass (see
/// [`sql::JOB_PROMOTE_DUE`]).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one statement.
pub async fn promote_due(shard: &Shard, limit: i64) -> Result<u64, ShardError> {
    exec::execute(
        shard,
        sql::JOB_PROMOTE_DUE,
        &[
            (&locks::maintenance_class(), Type::INT4),
            (&locks::PROMOTION_SLOT, Type::INT4),
            (&limit, Type::INT8),
            (&KEY_LOCKS_PER_STATEMENT, Type::INT8),
        ],
    )
    .await
}

/// How long until the earliest scheduled job on `shard` is due by its
/// clock (zero: due already); `None` when none is scheduled.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn next_due(shard: &Shard) -> Result<Option<Duration>, ShardError> {
    let row = exec::query_one(shard, sql::JOB_NEXT_DUE, &[]).await?;
    Ok(row
        .get::<_, Option<i64>>("ms")
        .map(|ms| Duration::from_millis(ms.max(0) as u64)))
}

/// Deletes up to `limit` jobs on `shard` finished more than `age` ago, with
/// their steps, unless another process is doing it. Returns how many.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one statement.
pub async fn delete_finished(shard: &Shard, age: Duration, limit: i64) -> Result<u64, ShardError> {
    let age_ms = age.as_millis() as i64;
    exec::execute(
        shard,
        sql::JOB_DELETE_FINISHED,
        &[
            (&locks::maintenance_class(), Type::INT4),
            (&locks::RETENTION_SLOT, Type::INT4),
            (&age_ms, Type::INT8),
            (&limit, Type::INT8),
        ],
    )
    .await
}

/// Deletes up to `limit` group start-rate buckets on `shard` that are full
/// again and not taken from for 10 minutes
/// ([`sql::GROUP_BUCKETS_FORGET_FULL`]). Returns how many.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one statement.
pub async fn forget_full_buckets(shard: &Shard, limit: i64) -> Result<u64, ShardError> {
    exec::execute(
        shard,
        sql::GROUP_BUCKETS_FORGET_FULL,
        &[(&limit, Type::INT8)],
    )
    .await
}

/// Deletes up to `limit` key floors on `shard` of keys quiet for an hour,
/// among about `percent` % of the floors' pages
/// ([`sql::KEY_FLOORS_FORGET_QUIET`]). Returns how many.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one statement.
pub async fn forget_quiet_key_floors(
    shard: &Shard,
    limit: i64,
    percent: f64,
) -> Result<u64, ShardError> {
    exec::execute(
        shard,
        sql::KEY_FLOORS_FORGET_QUIET,
        &[(&limit, Type::INT8), (&percent, Type::FLOAT8)],
    )
    .await
}
