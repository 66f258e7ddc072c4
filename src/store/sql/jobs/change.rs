//! Changing one job by hand: cancel, retry. A retried job that is ready
//! notifies `shardq_ready`, as an enqueue does.

/// Cancels a job: a waiting one at once, a running one by asking its worker.
/// Returns the job's status after the change (no row: unknown or finished).
/// Run between [`super::KEYS_LOCK`] and [`super::KEYS_PROMOTE`]: cancelling a
/// retrying job releases its key.
///
/// A job `held` by a range move (`shardq reshard`) keeps its status and
/// gets the request: the move copies the request with it and cancels it when
/// it releases the range. A held stand-in of a job running on its old shard
/// is not the job: it is left alone, so the caller goes on to that shard.
///
/// The cancel writes, in its transaction, the cascade its children are
/// owed (`shardq_owe_cascades`; `owed` is its generation): the caller's
/// cascade runs next and pays it, and should it not finish, the workers'
/// pass runs it again ([`super::super::CASCADES_OWED_TAKE`]).
pub const JOB_CANCEL: &str = "WITH c AS (UPDATE workflow_status SET \
        status = CASE WHEN status IN ('running', 'held') THEN status ELSE 'cancelled' END, \
        cancel_requested = status IN ('running', 'held'), \
        finished_at = CASE WHEN status IN ('running', 'held') THEN NULL ELSE now() END \
    WHERE shard_key = $1 AND id = $2 \
        AND (status IN ('waiting', 'scheduled', 'queued', 'running') \
             OR (status = 'held' AND held_status <> 'running')) \
    RETURNING shard_key, id, status), \
    owed AS (SELECT shardq_owe_cascades(array_agg(c.shard_key), array_agg(c.id)) AS generation \
        FROM c) \
    SELECT c.status, owed.generation AS owed FROM c, owed";

/// Puts a dead, failed or cancelled job back with fresh attempts: `queued`,
/// or `waiting` behind its key. A debounced job comes back as an ordinary one
/// (`debounce_until` cleared: a cancelled pending run may still hold it),
/// so it never counts as its key's pending run. Returns a row when it did. Run between
/// [`super::KEYS_LOCK`] and [`super::KEYS_PROMOTE`], which queues it when its
/// key is free.
///
/// Only on the shard that holds the job's key range now: a job that
/// finished on a shard its range has since left (`shardq reshard`) is not
/// put back there, where no enqueue of its key goes any more; nor while
/// its range is moving (its key's jobs are held, or still on the old
/// shard): retry it once the move is done. Nor a cancel cascade's
/// stand-in for a child that never started (`CHILD_STAND_INS`: it holds
/// no payload, key or settings of the child to run).
pub const JOB_RETRY: &str = "UPDATE workflow_status SET \
        status = CASE WHEN ordering_key IS NULL THEN 'queued' ELSE 'waiting' END, \
        attempts = 0, run_at = now(), finished_at = NULL, cancel_requested = false, \
        debounce_until = NULL \
    WHERE shard_key = $1 AND id = $2 AND status IN ('dead', 'failed', 'cancelled') \
        AND NOT (parent_id IS NOT NULL AND started_at IS NULL \
            AND error IS NOT DISTINCT FROM 'cancelled with its parent before it started') \
        AND EXISTS (SELECT 1 FROM shardq_map_ranges r \
            WHERE r.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e) \
              AND r.shard_index = (SELECT m.shard_index FROM shardq_shard_map m) \
              AND r.first_key <= $1 AND $1 < r.end_key) \
        AND NOT EXISTS (SELECT 1 FROM shardq_map_moves v \
            WHERE v.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e) \
              AND v.state <> 'released' AND v.first_key <= $1 AND $1 < v.end_key) \
    RETURNING id";
