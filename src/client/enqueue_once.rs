//! Enqueue exactly once, even when a reply is lost.
//!
//! A connection that breaks after the server committed an insert looks to the
//! client exactly like one that broke before: it cannot tell whether its jobs
//! were written. So every enqueue takes its jobs' ids first (one statement per
//! shard, [`jobs::reserve_ids`]), then inserts them under those ids
//! ([`jobs::insert_many_as`]); a retry inserts with `ON CONFLICT DO NOTHING`
//! on the primary key, so it writes each job once, whatever became of the
//! earlier try (the first try needs no ON CONFLICT, which costs a WAL record
//! per row: nothing can conflict with ids just taken). The client retries a failed insert itself a few times; when
//! that does not settle it, the error carries the call ([`PendingEnqueue`])
//! for [`Client::enqueue_again`], which is just as safe.
//!
//! Cost: one more statement and round trip per call and shard (the ids),
//! nothing per job on the table (no token column, no index): see
//! bench/results/round8/enqueue_retry.txt.

use super::error::ClientError;
use super::handle::Client;
use super::pending::{PendingEnqueue, Reserved};
use crate::job::{JobId, NewJob, OnDuplicate};
use crate::shard_map::ShardMap;
use crate::shards::{Shard, ShardError};
use crate::store::jobs::{self, NewRow};
use crate::store::ErrorKind;
use futures_util::future::{join_all, try_join_all};
use rand::Rng;
use std::future::Future;
use std::time::{Duration, Instant};

/// Tries of one statement of an enqueue before the caller is told: enough to
/// ride out a dropped connection or two (each retry takes a fresh one).
const ENQUEUE_TRIES: u32 = 5;

/// Pause before the first retry, growing [`RETRY_GROWTH`]-fold: 50, 150,
/// 450, 1,350 ms, about 2 s in all, what a restarting server needs to accept
/// connections again.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(50);
const RETRY_GROWTH: u32 = 3;

/// No retry starts later than this after the first try: a shard that does
/// not answer at all (each try waits out the statement deadline) fails the
/// call after one or two tries, not five.
const RETRY_WINDOW: Duration = Duration::from_secs(5);

/// How long a write waits for a move to open the range it writes into
/// ([`crate::store::MOVE_NOT_OPEN`]): a running `shardq reshard`
/// records the new map on every shard before it opens the ranges, seconds
/// on a loaded fleet; past this, the move is taken for stopped and the
/// caller is told.
const MOVE_OPEN_WAIT: Duration = Duration::from_secs(30);

/// The longest pause between two tries while a range is not open yet.
const MOVE_OPEN_PAUSE_MAX: Duration = Duration::from_secs(1);

/// Reloads of the shard map within one call when shards refuse its jobs as
/// routed by an old epoch (SQ004): a move in progress writes an epoch per
/// range moved, so a second refusal can follow the first; more than this
/// means the map keeps changing under the call, and the caller is told.
const MAP_RELOADS: usize = 3;

/// Attempts at inserting a deduplicated job while the holder of its id finishes.
const DEDUP_RACE_RETRIES: usize = 3;

/// Runs `op` until it succeeds, fails permanently (SQLSTATE class 22, 23 or
/// 42), was tried [`ENQUEUE_TRIES`] times, or [`RETRY_WINDOW`] has passed;
/// a write into a range a move has not opened yet is tried again for up to
/// [`MOVE_OPEN_WAIT`].
/// `op` is told whether an earlier try (this call's, or one before it when
/// `again` is set) may have written something, and must then be safe to
/// repeat. Each retry borrows a fresh connection (a broken one is not
/// returned to the pool).
pub(super) async fn with_retries<T, F, Fut>(
    what: &str,
    again: bool,
    mut op: F,
) -> Result<T, ShardError>
where
    F: FnMut(bool) -> Fut,
    Fut: Future<Output = Result<T, ShardError>>,
{
    let started = Instant::now();
    let mut pause = FIRST_RETRY_PAUSE;
    for tries in 1.. {
        let err = match op(again || tries > 1).await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        let range_not_open = err
            .sqlstate()
            .is_some_and(|code| code.code() == crate::store::MOVE_NOT_OPEN);
        if range_not_open && started.elapsed() < MOVE_OPEN_WAIT {
            tracing::debug!(tries, "{what} waits for a move to open its range");
            pause = pause.min(MOVE_OPEN_PAUSE_MAX);
            let jittered = pause.mul_f64(rand::thread_rng().gen_range(0.5..1.5));
            tokio::time::sleep(jittered).await;
            pause *= RETRY_GROWTH;
            continue;
        }
        if err.is_permanent()
            || repeats_identically(&err)
            || tries >= ENQUEUE_TRIES
            || started.elapsed() + pause > RETRY_WINDOW
        {
            return Err(err);
        }
        tracing::debug!(
            error = %crate::error_chain::error_chain(&err),
            tries,
            "{what} failed; trying again with the same ids"
        );
        // Jitter, so that the clients a fault hit together do not come back
        // together.
        let jittered = pause.mul_f64(rand::thread_rng().gen_range(0.5..1.5));
        tokio::time::sleep(jittered).await;
        pause *= RETRY_GROWTH;
    }
    unreachable!("the loop returns")
}

/// Whether `err` is one a retry meets again though it is not about the data:
/// SQLSTATE class 42 (an undefined function: the shard's schema is older
/// than this client, run `shardq migrate`; a missing privilege), or a stale
/// shard map (SQ004: the caller routes the jobs again by a reloaded map).
fn repeats_identically(err: &ShardError) -> bool {
    err.kind() == ErrorKind::StaleMap
        || err
            .sqlstate()
            .is_some_and(|code| code.code().starts_with("42"))
}

impl Client {
    /// Takes ids for jobs routed by `map` (`per_shard`: the jobs without
    /// deduplication id by shard index; `deduplicated`: the others), shards
    /// in parallel.
    /// Writes nothing, so its error means nothing was written.
    pub(super) async fn reserve(
        &self,
        total: usize,
        per_shard: Vec<Vec<(usize, i32, NewJob)>>,
        deduplicated: Vec<(usize, i32, NewJob)>,
        map: &ShardMap,
    ) -> Result<PendingEnqueue, ClientError> {
        let mut by_shard = per_shard;
        for (index, shard_key, job) in deduplicated {
            by_shard[map.shard_for(shard_key)].push((index, shard_key, job));
        }
        let reservations = by_shard
            .into_iter()
            .enumerate()
            .filter(|(_, part)| !part.is_empty())
            .map(|(shard_index, mut part)| async move {
                part.sort_by_key(|(index, _, _)| *index);
                let shard = self.shards.get(shard_index);
                let ids = with_retries("taking job ids", false, |_| {
                    jobs::reserve_ids(shard, part.len())
                })
                .await?;
                // Ascending ids in input order: a key's jobs keep the order
                // they were given in.
                let reserved = part
                    .into_iter()
                    .zip(ids)
                    .map(|((index, shard_key, job), id)| Reserved {
                        index,
                        shard_key,
                        job,
                        id,
                    })
                    .collect();
                Ok::<_, ShardError>((shard_index, reserved))
            });
        let parts = try_join_all(reservations).await?;
        Ok(PendingEnqueue {
            total,
            epoch: map.epoch(),
            parts,
        })
    }

    /// Writes the jobs of an enqueue whose outcome was unknown
    /// ([`ClientError::OutcomeUnknown`]): each job that is there already is
    /// left as it is, the others are written. Returns the ids in the call's
    /// input order, as [`Client::enqueue_many`] would have.
    ///
    /// # Errors
    ///
    /// As [`Client::enqueue_many`]; [`ClientError::OutcomeUnknown`] again
    /// when a shard still does not answer (call this again later).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe (some jobs may be written), but calling it again with
    /// the same pending enqueue is safe.
    pub async fn enqueue_again(&self, pending: PendingEnqueue) -> Result<Vec<JobId>, ClientError> {
        self.write(pending, true).await
    }

    /// Writes every part of `pending`, shards in parallel (each shard is
    /// tried even when another fails). An error that a retry may clear
    /// becomes [`ClientError::OutcomeUnknown`] carrying `pending`. `again`:
    /// an earlier call may have written some of it.
    pub(super) async fn write(
        &self,
        mut pending: PendingEnqueue,
        mut again: bool,
    ) -> Result<Vec<JobId>, ClientError> {
        let mut ids = vec![
            JobId {
                shard_key: 0,
                id: 0
            };
            pending.total
        ];
        // The parts still to write: all of them, then those routed again.
        let mut todo: Vec<usize> = (0..pending.parts.len()).collect();
        for reloads in 0.. {
            let writes = todo.iter().map(|&p| {
                let (shard_index, part) = &pending.parts[p];
                self.write_part(self.shards.get(*shard_index), part, pending.epoch, again)
            });
            let mut unknown = None;
            let mut failed = None;
            let mut stale = Vec::new();
            for (&p, written) in todo.iter().zip(join_all(writes).await) {
                match written {
                    Ok(part) => {
                        for (index, id) in part {
                            ids[index] = id;
                        }
                    }
                    Err(ClientError::Shard(err)) if err.kind() == ErrorKind::StaleMap => {
                        stale.push((p, err));
                    }
                    Err(ClientError::Shard(err)) if !err.is_permanent() => {
                        unknown.get_or_insert(err);
                    }
                    Err(err) => {
                        failed.get_or_insert(err);
                    }
                }
            }
            // Unknown first: once it is settled by `enqueue_again`, a final
            // error (a duplicate, bad data) comes back the same way.
            if let Some(source) = unknown {
                return Err(ClientError::OutcomeUnknown {
                    pending: Box::new(pending),
                    source,
                });
            }
            if let Some(err) = failed {
                return Err(err);
            }
            if stale.is_empty() {
                return Ok(ids);
            }
            if reloads >= MAP_RELOADS {
                let (_, err) = stale.swap_remove(0);
                return Err(ClientError::Shard(err));
            }
            let (next, written) = self.route_again(&mut pending, stale).await?;
            for (index, id) in written {
                ids[index] = id;
            }
            todo = next;
            again = false;
        }
        unreachable!("the loop returns")
    }

    /// Writes one shard's jobs: those without deduplication id or debounce
    /// in one statement per 5,000, then the debounced ones (one statement
    /// per 5,000 too), then each deduplicated one. Returns (input position,
    /// id) of each.
    async fn write_part(
        &self,
        shard: &Shard,
        part: &[Reserved],
        epoch: i32,
        again: bool,
    ) -> Result<Vec<(usize, JobId)>, ClientError> {
        let (debounced, part): (Vec<&Reserved>, Vec<&Reserved>) =
            part.iter().partition(|r| r.job.debounce.is_some());
        let (plain, deduplicated): (Vec<&Reserved>, Vec<&Reserved>) =
            part.into_iter().partition(|r| r.job.dedup_id.is_none());
        let rows: Vec<NewRow> = plain
            .iter()
            .map(|r| self.row(r.shard_key, &r.job))
            .collect();
        let row_ids: Vec<i64> = plain.iter().map(|r| r.id).collect();
        if !rows.is_empty() {
            with_retries("enqueue", again, |again| {
                jobs::insert_many_as(shard, &rows, &row_ids, Some(epoch), again)
            })
            .await?;
        }
        let mut out: Vec<(usize, JobId)> = plain.iter().map(|r| (r.index, r.job_id())).collect();
        if !debounced.is_empty() {
            out.extend(
                self.write_debounced(shard, &debounced, epoch, again)
                    .await?,
            );
        }
        for r in deduplicated {
            out.push((
                r.index,
                self.write_deduplicated(shard, r, epoch, again).await?,
            ));
        }
        Ok(out)
    }

    /// Inserts a job with a deduplication id under its reserved id, or finds
    /// the unfinished job that holds the deduplication id. A skipped insert
    /// whose own id exists was an earlier try of this call that committed
    /// (its reply lost): that is this job, not a duplicate.
    ///
    /// Between the skipped insert and the lookups, the holder of the
    /// deduplication id may finish: then the insert is tried again. An
    /// earlier try still running on the server cannot commit in between: the
    /// skipped insert waited for it (the unique checks), so the lookup of the
    /// own id sees it. One that the server reads only later (sent before the
    /// connection broke, to a server that was frozen) meets this job's row
    /// and is skipped; only when this call found another holder of the
    /// deduplication id, and that holder finished before the late try ran,
    /// is the late try written as well.
    async fn write_deduplicated(
        &self,
        shard: &Shard,
        r: &Reserved,
        epoch: i32,
        again: bool,
    ) -> Result<JobId, ClientError> {
        let dedup_id = r.job.dedup_id.as_deref().unwrap_or_default();
        let row = self.row(r.shard_key, &r.job);
        for _ in 0..DEDUP_RACE_RETRIES {
            let written = with_retries("enqueue", again, |_| {
                jobs::insert_dedup_as(shard, row, dedup_id, r.id, Some(epoch))
            })
            .await?;
            if written
                || with_retries("enqueue", again, |_| jobs::exists(shard, r.job_id())).await?
            {
                return Ok(r.job_id());
            }
            let holder = with_retries("enqueue", again, |_| {
                jobs::find_dedup(shard, &r.job.queue, dedup_id)
            })
            .await?;
            if let Some(existing) = holder {
                return match r.job.on_duplicate {
                    OnDuplicate::ReturnExisting => Ok(existing),
                    OnDuplicate::Error => Err(ClientError::Duplicate {
                        index: r.index,
                        dedup_id: dedup_id.to_string(),
                        existing,
                    }),
                };
            }
        }
        Err(ClientError::DedupContended {
            index: r.index,
            dedup_id: dedup_id.to_string(),
        })
    }
}
