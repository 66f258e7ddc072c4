//! The statements of a range move (`shardq reshard`, src/reshard/), each
//! on one shard: recording an epoch with its moves, copying a range's
//! unclaimed jobs, releasing the jobs held on the new shard.
//!
//! These run on sessions of the shard's pool (a transaction pooler cannot
//! carry the move lock or a multi-statement transaction; the caller refuses
//! one first), each within the shard's statement deadline
//! (`exec::in_session`): a frozen shard is an error after it, which the
//! command tries again, not a hang.

use super::exec::in_session;
use super::{locks, sql};
use crate::shard_map::{EpochRecord, KeyRange, MoveRow};
use crate::shards::{PooledClient, Shard, ShardError};
use serde_json::Value;
use std::collections::HashSet;

fn to_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Every epoch `shard` records, with ranges and moves, oldest first (none
/// when its schema has no map tables yet).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn history(shard: &Shard) -> Result<Vec<EpochRecord>, ShardError> {
    in_session(shard, |db| async move {
        let mut out = Vec::new();
        let present: bool = db
            .query_one(sql::RESHARD_MAP_TABLES, &[])
            .await?
            .get("present");
        if !present {
            return Ok(out);
        }
        for row in db.query(sql::RESHARD_EPOCHS, &[]).await? {
            let epoch: i32 = row.get("epoch");
            let ranges = db
                .query(sql::MAP_RANGES_OF, &[&epoch])
                .await?
                .iter()
                .map(|r| KeyRange {
                    first_key: r.get("first_key"),
                    end_key: r.get("end_key"),
                    shard_index: usize::try_from(r.get::<_, i32>("shard_index")).unwrap_or(0),
                })
                .collect();
            let moves = db
                .query(sql::RESHARD_MOVES_OF, &[&epoch])
                .await?
                .iter()
                .map(|r| MoveRow {
                    first_key: r.get("first_key"),
                    end_key: r.get("end_key"),
                    from_index: usize::try_from(r.get::<_, i32>("from_index")).unwrap_or(0),
                    to_index: usize::try_from(r.get::<_, i32>("to_index")).unwrap_or(0),
                    state: r.get("state"),
                })
                .collect();
            out.push(EpochRecord {
                epoch,
                shard_count: row.get("shard_count"),
                ranges,
                moves,
            });
        }
        Ok(out)
    })
    .await
}

/// Whether `shard` holds any job.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn has_jobs(shard: &Shard) -> Result<bool, ShardError> {
    in_session(shard, |db| async move {
        let row = db.query_one(sql::RESHARD_HAS_JOBS, &[]).await?;
        Ok(row.get("any"))
    })
    .await
}

/// The last id `shard`'s sequence gave.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn last_id(shard: &Shard) -> Result<i64, ShardError> {
    in_session(shard, |db| async move {
        let row = db.query_one(sql::RESHARD_LAST_ID, &[]).await?;
        Ok(row.get("last_value"))
    })
    .await
}

/// What [`record_epoch`] writes on one shard.
#[derive(Debug, Clone)]
pub struct EpochWrite<'a> {
    /// The epoch to record, with its ranges and moves (all `closed`).
    pub record: &'a EpochRecord,
    /// The epochs before it, written first on a shard that forgets its own
    /// map (a shard new to the list); `None` for the others.
    pub history: Option<&'a [EpochRecord]>,
    /// Whether ranges move in to this shard: the hold trigger goes on and
    /// the id sequence is raised to `ids_from`.
    pub moving_in: bool,
    /// The lowest id a shard a range moves to gives from now on (its
    /// sequence is raised to it; its hold trigger refuses lower ids).
    pub ids_from: i64,
    /// Whether this shard stays in the list (its count is updated).
    pub in_list: bool,
}

/// Records `write.record` on `shard` unless it records that epoch already
/// (then nothing changes: a command run again after it stopped); a shard
/// given `write.history` forgets its map and takes it whole. Under the
/// map's lock, exclusive: no enqueue routed by the old epoch commits after
/// this one. Returns whether it wrote.
///
/// # Errors
///
/// [`ShardError`] when the shard fails; nothing is written then.
pub async fn record_epoch(shard: &Shard, write: &EpochWrite<'_>) -> Result<bool, ShardError> {
    in_session(shard, |mut db| async move {
        if write.moving_in {
            // Before the map's lock, in its own transaction (see
            // RESHARD_TRIGGER_ON); harmless while no range moves in.
            db.batch_execute(sql::RESHARD_TRIGGER_ON).await?;
        }
        let tx = db.transaction().await?;
        tx.execute(
            sql::RESHARD_MAP_LOCK,
            &[&locks::maintenance_class(), &locks::MAP_SLOT],
        )
        .await?;
        tx.query_one(sql::RESHARD_MAP_CHANGE_MARK, &[]).await?;
        let recorded = tx
            .query_opt(
                "SELECT 1 FROM shardq_map_epochs WHERE epoch = $1",
                &[&write.record.epoch],
            )
            .await?;
        if recorded.is_some() && write.history.is_none() {
            return Ok(false);
        }
        if let Some(history) = write.history {
            tx.batch_execute(sql::RESHARD_MAP_FORGET).await?;
            for record in history {
                insert_epoch(&tx, record, None, 0).await?;
            }
        }
        insert_epoch(&tx, write.record, Some("closed"), write.ids_from).await?;
        if write.moving_in {
            tx.execute(sql::RESHARD_RAISE_IDS, &[&write.ids_from])
                .await?;
        }
        if write.in_list {
            tx.execute(sql::RESHARD_PLACE_COUNT, &[&write.record.shard_count])
                .await?;
        }
        tx.commit().await?;
        Ok(true)
    })
    .await
}

/// Inserts one epoch with its ranges and moves (their recorded state, or
/// `state` for every move; `ids_from` the new shards' first id).
async fn insert_epoch(
    db: &deadpool_postgres::Transaction<'_>,
    record: &EpochRecord,
    state: Option<&str>,
    ids_from: i64,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        sql::RESHARD_EPOCH_RECORD,
        &[&record.epoch, &record.shard_count],
    )
    .await?;
    let firsts: Vec<i32> = record.ranges.iter().map(|r| r.first_key).collect();
    let ends: Vec<i32> = record.ranges.iter().map(|r| r.end_key).collect();
    let shards: Vec<i32> = record
        .ranges
        .iter()
        .map(|r| to_i32(r.shard_index))
        .collect();
    db.execute(
        sql::RESHARD_RANGES_RECORD,
        &[&record.epoch, &firsts, &ends, &shards],
    )
    .await?;
    let firsts: Vec<i32> = record.moves.iter().map(|m| m.first_key).collect();
    let ends: Vec<i32> = record.moves.iter().map(|m| m.end_key).collect();
    let from: Vec<i32> = record.moves.iter().map(|m| to_i32(m.from_index)).collect();
    let to: Vec<i32> = record.moves.iter().map(|m| to_i32(m.to_index)).collect();
    let states: Vec<String> = record
        .moves
        .iter()
        .map(|m| state.unwrap_or(&m.state).to_string())
        .collect();
    db.execute(
        sql::RESHARD_MOVES_RECORD,
        &[
            &record.epoch,
            &firsts,
            &ends,
            &from,
            &to,
            &states,
            &ids_from,
        ],
    )
    .await?;
    Ok(())
}

/// Sets the state of the move of `epoch` starting at `first_key` on
/// `shard`; returns whether the shard records that move (false: nothing
/// changed).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn set_move_state(
    shard: &Shard,
    epoch: i32,
    first_key: i32,
    state: &str,
) -> Result<bool, ShardError> {
    in_session(shard, |mut db| async move {
        let tx = db.transaction().await?;
        tx.query_one(sql::RESHARD_MAP_CHANGE_MARK, &[]).await?;
        let changed = tx
            .execute(sql::RESHARD_MOVE_STATE, &[&first_key, &epoch, &state])
            .await?;
        tx.commit().await?;
        Ok(changed == 1)
    })
    .await
}

/// A session holding the move lock of `shard` (enqueues of a `closed`
/// range wait on it); the lock goes with the session.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn hold_move_lock(shard: &Shard) -> Result<PooledClient, ShardError> {
    in_session(shard, |db| async move {
        db.execute(
            sql::RESHARD_MOVE_LOCK,
            &[&locks::maintenance_class(), &locks::MOVE_SLOT],
        )
        .await?;
        Ok(db)
    })
    .await
}

/// Gives back the lock [`hold_move_lock`] took.
///
/// # Errors
///
/// [`ShardError`] when the shard fails (the lock goes with the session
/// then, which the pool cleans).
pub async fn release_move_lock(shard: &Shard, db: PooledClient) -> Result<(), ShardError> {
    shard
        .within(async {
            db.execute(
                sql::RESHARD_MOVE_UNLOCK,
                &[&locks::maintenance_class(), &locks::MOVE_SLOT],
            )
            .await
            .map_err(|e| shard.query_error(e))?;
            Ok(())
        })
        .await
}

/// The shard keys of `range` on `shard` with jobs to move, and how many
/// each; only keys with a deduplicated job or a debounced job's pending
/// run when `dedup_only` (the copy before a range opens).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn keys_to_move(
    shard: &Shard,
    (first, end): (i32, i32),
    dedup_only: bool,
) -> Result<Vec<(i32, i64)>, ShardError> {
    in_session(shard, |db| async move {
        let rows = db
            .query(sql::RESHARD_KEYS_TO_MOVE, &[&first, &end, &dedup_only])
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get("shard_key"), r.get("n")))
            .collect())
    })
    .await
}

/// Marks the unclaimed jobs of shard keys `first..end` held on the old
/// shard; returns how many.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn mark_held(shard: &Shard, (first, end): (i32, i32)) -> Result<u64, ShardError> {
    in_session(shard, |db| async move {
        db.execute(sql::RESHARD_MARK, &[&first, &end]).await
    })
    .await
}

/// The held jobs of shard keys `first..end` with ids above `after`, at most
/// `limit` of them by id (a JSON array), and what goes with them.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn read_held(
    shard: &Shard,
    (first, end): (i32, i32),
    after: i64,
    limit: i64,
) -> Result<HeldJobs, ShardError> {
    in_session(shard, |db| async move {
        let held = db
            .query_one(sql::RESHARD_HELD_READ, &[&first, &end, &after, &limit])
            .await?;
        Ok(HeldJobs {
            jobs: held.get("jobs"),
            steps: held.get("steps"),
            messages: held.get("messages"),
            events: held.get("events"),
        })
    })
    .await
}

/// Jobs to copy and the rows of theirs that go with them, each a JSON
/// array of rows ([`read_held`], [`write_copies`]).
#[derive(Debug, Clone)]
pub struct HeldJobs {
    /// The jobs (`workflow_status` rows).
    pub jobs: Value,
    /// Their recorded steps.
    pub steps: Value,
    /// Their messages, in `seq` order.
    pub messages: Value,
    /// Their events.
    pub events: Value,
}

impl HeldJobs {
    /// Nothing to copy.
    pub fn empty() -> HeldJobs {
        let empty = Value::Array(Vec::new());
        HeldJobs {
            jobs: empty.clone(),
            steps: empty.clone(),
            messages: empty.clone(),
            events: empty,
        }
    }
}

/// Stand-ins (a JSON array) for the deduplicated jobs of `first..end` that
/// hold their deduplication id on `shard` (running, or unclaimed and not
/// copied).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn read_stand_ins(shard: &Shard, (first, end): (i32, i32)) -> Result<Value, ShardError> {
    in_session(shard, |db| async move {
        let row = db
            .query_one(sql::RESHARD_STAND_INS_READ, &[&first, &end])
            .await?;
        Ok(row.get("jobs"))
    })
    .await
}

/// On the new shard, in one transaction: replaces earlier held copies of
/// `held.jobs` and writes them with their steps, messages and events, and
/// the `stand_ins` (kept when a copy exists). Returns the (id, shard key)
/// of the jobs written.
///
/// # Errors
///
/// [`ShardError`] when the shard fails; nothing is written then.
pub async fn write_copies(
    shard: &Shard,
    held: &HeldJobs,
    stand_ins: &Value,
) -> Result<Vec<(i64, i32)>, ShardError> {
    let jobs = &held.jobs;
    in_session(shard, |mut db| async move {
        let tx = db.transaction().await?;
        // A cancel recorded on an earlier copy (the run stopped before
        // removing the old shard's row) is kept in the copy that
        // replaces it.
        let cancelled: HashSet<(i64, i32)> = tx
            .query(sql::RESHARD_COPY_CANCELLED, &[jobs])
            .await?
            .iter()
            .map(|r| (r.get("id"), r.get("shard_key")))
            .collect();
        let jobs = with_cancels(jobs, &cancelled);
        tx.execute(sql::RESHARD_COPY_REPLACE, &[&jobs]).await?;
        let written = tx
            .query(
                &format!("{} RETURNING id, shard_key", sql::RESHARD_COPY_JOBS),
                &[&jobs],
            )
            .await?;
        tx.execute(sql::RESHARD_COPY_STEPS, &[&held.steps]).await?;
        tx.execute(sql::RESHARD_COPY_MESSAGES, &[&held.messages])
            .await?;
        tx.execute(sql::RESHARD_COPY_EVENTS, &[&held.events])
            .await?;
        tx.execute(sql::RESHARD_COPY_JOBS, &[stand_ins]).await?;
        tx.commit().await?;
        Ok(written
            .iter()
            .map(|r| (r.get("id"), r.get("shard_key")))
            .collect())
    })
    .await
}

/// `jobs` (a JSON array) with `cancel_requested` set on those in `cancelled`.
fn with_cancels(jobs: &Value, cancelled: &HashSet<(i64, i32)>) -> Value {
    let mut jobs = jobs.clone();
    if cancelled.is_empty() {
        return jobs;
    }
    for job in jobs.as_array_mut().into_iter().flatten() {
        let id = job["id"].as_i64().unwrap_or(-1);
        let key = job["shard_key"]
            .as_i64()
            .and_then(|k| i32::try_from(k).ok());
        if key.is_some_and(|k| cancelled.contains(&(id, k))) {
            job["cancel_requested"] = Value::Bool(true);
        }
    }
    jobs
}

/// On the old shard: removes the copied jobs (id, shard key, the cancel
/// request they were copied with) of shard keys `first..end`; returns how
/// many.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn drop_copied(
    shard: &Shard,
    (first, end): (i32, i32),
    copied: &[(i64, i32, bool)],
) -> Result<u64, ShardError> {
    let ids: Vec<i64> = copied.iter().map(|c| c.0).collect();
    let keys: Vec<i32> = copied.iter().map(|c| c.1).collect();
    let cancels: Vec<bool> = copied.iter().map(|c| c.2).collect();
    in_session(shard, |db| async move {
        db.execute(
            sql::RESHARD_DROP_COPIED,
            &[&first, &end, &ids, &keys, &cancels],
        )
        .await
    })
    .await
}

/// On the old shard: finishes as cancelled those of the `refused` jobs of
/// `first..end` whose cancellation was asked; returns how many.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn cancel_refused(
    shard: &Shard,
    (first, end): (i32, i32),
    refused: &[i64],
) -> Result<u64, ShardError> {
    in_session(shard, |db| async move {
        db.execute(sql::RESHARD_CANCEL_REFUSED, &[&first, &end, &refused])
            .await
    })
    .await
}

/// The unfinished jobs of `first..end` left on `shard`.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
pub async fn left(shard: &Shard, (first, end): (i32, i32)) -> Result<i64, ShardError> {
    in_session(shard, |db| async move {
        let row = db.query_one(sql::RESHARD_LEFT, &[&first, &end]).await?;
        Ok(row.get("n"))
    })
    .await
}

/// On the new shard, in one transaction under the map's lock: releases the
/// held jobs of the move of `epoch` at `first..end` (stand-ins dropped, a
/// key left with waiting jobs only gets its head queued) and records the
/// move `released`; when no other range moves in, the hold trigger goes.
/// Returns the jobs released.
///
/// # Errors
///
/// [`ShardError`] when the shard fails; nothing changes then.
pub async fn release(
    shard: &Shard,
    epoch: i32,
    (first, end): (i32, i32),
) -> Result<u64, ShardError> {
    in_session(shard, |mut db| async move {
        let tx = db.transaction().await?;
        tx.execute(
            sql::RESHARD_MAP_LOCK,
            &[&locks::maintenance_class(), &locks::MAP_SLOT],
        )
        .await?;
        tx.query_one(sql::RESHARD_MAP_CHANGE_MARK, &[]).await?;
        let rows = tx.query(sql::RESHARD_RELEASE, &[&first, &end]).await?;
        let keys: Vec<i32> = rows.iter().map(|r| r.get("shard_key")).collect();
        let ids: Vec<i64> = rows.iter().map(|r| r.get("id")).collect();
        tx.query(sql::KEYS_PROMOTE, &[&keys, &ids]).await?;
        tx.execute(sql::RESHARD_MOVE_STATE, &[&first, &epoch, &"released"])
            .await?;
        tx.commit().await?;
        let released = rows.len() as u64;
        let moving: bool = db
            .query_one(sql::RESHARD_STILL_MOVING_IN, &[])
            .await?
            .get("moving");
        if !moving {
            // Left on when its lock is not had at once: it writes
            // nothing held once no range moves in; the next release or
            // run tries again.
            if let Err(e) = db.batch_execute(sql::RESHARD_TRIGGER_OFF).await {
                let _ = db.batch_execute("RESET lock_timeout").await;
                tracing::warn!(
                    shard = %shard.name,
                    error = %shard.query_error(e),
                    "the hold trigger stays on for now"
                );
            }
        }
        Ok(released)
    })
    .await
}
