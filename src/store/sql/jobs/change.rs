//! Changing one job by hand: cancel, retry. A retried job that is ready
//! notifies `shardq_ready`, as an enqueue does.

/// Cancels a job: a waiting one at once, a running one by asking its worker.
/// Returns the job's status after the change (no row: unknown or finished).
/// Run between [`super::KEYS_LOCK`] and [`super::KEYS_PROMOTE`]: cancelling a
/// retrying job releases its key.
pub const JOB_CANCEL: &str = "UPDATE workflow_status SET \
        status = CASE WHEN status = 'running' THEN 'running' ELSE 'cancelled' END, \
        cancel_requested = (status = 'running'), \
        finished_at = CASE WHEN status = 'running' THEN NULL ELSE now() END \
    WHERE shard_key = $1 AND id = $2 \
        AND status IN ('waiting', 'scheduled', 'queued', 'running') \
    RETURNING status";

/// Puts a dead, failed or cancelled job back with fresh attempts: `queued`,
/// or `waiting` behind its key. Returns a row when it did. Run between
/// [`super::KEYS_LOCK`] and [`super::KEYS_PROMOTE`], which queues it when its
/// key is free.
pub const JOB_RETRY: &str = "UPDATE workflow_status SET \
        status = CASE WHEN ordering_key IS NULL THEN 'queued' ELSE 'waiting' END, \
        attempts = 0, run_at = now(), finished_at = NULL, cancel_requested = false \
    WHERE shard_key = $1 AND id = $2 AND status IN ('dead', 'failed', 'cancelled') \
    RETURNING id";
