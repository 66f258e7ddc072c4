//! Per-shard upkeep: lease recovery, promotion of due jobs, retention. Each
//! statement first tries its own transaction-level advisory lock ($1 class,
//! $2 slot: `store::locks`), so one process at a time does each job on a
//! shard and the others skip it.

/// Takes upkeep lock ($1, $2) for this transaction; `got` is false when
/// another process holds it.
pub const UPKEEP_GATE: &str = "SELECT pg_try_advisory_xact_lock($1::int, $2::int) AS got";

/// Up to $1 running jobs whose lease expired (owner crashed or hung), oldest
/// first. Read without row locks: the key locks come next, and a row lock
/// held while waiting for them could deadlock with a completion.
pub const JOB_FIND_EXPIRED: &str = "SELECT shard_key, id FROM workflow_status \
    WHERE status = 'running' AND lease_expires_at < now() \
    ORDER BY lease_expires_at LIMIT $1";

/// Returns the expired jobs among ($1, $2) to the queue with their attempt
/// count kept (`waiting` behind their key when they have one); a job on its
/// last attempt becomes `dead` with the reason as its error, a cancelled one
/// `cancelled`. Re-checks the expiry on each row's latest version. Raises
/// the fence, so that a completion from the lost attempt arriving before the
/// next claim is fenced out, not taken for a repeat of its own write.
/// Returns the new status of each row.
pub const JOB_RECOVER_EXPIRED: &str = "UPDATE workflow_status w SET \
        status = CASE WHEN w.cancel_requested THEN 'cancelled' \
            WHEN w.attempts >= w.max_attempts THEN 'dead' \
            WHEN w.ordering_key IS NULL THEN 'queued' ELSE 'waiting' END, \
        error = CASE WHEN w.attempts >= w.max_attempts \
            THEN 'lease expired on attempt ' || w.attempts || ' of ' || w.max_attempts \
                || ' (the worker crashed or hung)' ELSE w.error END, \
        finished_at = CASE WHEN w.cancel_requested OR w.attempts >= w.max_attempts THEN now() END, \
        owner = NULL, lease_expires_at = NULL, fence = w.fence + 1 \
    FROM unnest($1::int[], $2::bigint[]) AS e(shard_key, id) \
    WHERE w.shard_key = e.shard_key AND w.id = e.id \
        AND w.status = 'running' AND w.lease_expires_at < now() \
    RETURNING w.status";

/// Makes up to $3 scheduled jobs whose time has come ready, when it gets
/// upkeep lock ($1, $2).
pub const JOB_PROMOTE_DUE: &str = "WITH gate AS MATERIALIZED ( \
        SELECT pg_try_advisory_xact_lock($1::int, $2::int) AS got \
    ), due AS ( \
        SELECT shard_key, id FROM workflow_status \
        WHERE status = 'scheduled' AND run_at <= now() AND (SELECT got FROM gate) \
        ORDER BY run_at LIMIT $3 FOR UPDATE SKIP LOCKED \
    ) \
    UPDATE workflow_status w SET status = 'queued' \
    FROM due WHERE w.shard_key = due.shard_key AND w.id = due.id \
    RETURNING pg_notify('shardq_ready', w.queue)";

/// Deletes up to $4 finished jobs (and, by cascade, their steps) that finished
/// more than $3 ms ago, oldest first, when it gets upkeep lock ($1, $2).
pub const JOB_DELETE_FINISHED: &str = "WITH gate AS MATERIALIZED ( \
        SELECT pg_try_advisory_xact_lock($1::int, $2::int) AS got \
    ), old AS ( \
        SELECT shard_key, id FROM workflow_status \
        WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled') \
            AND finished_at < now() - $3::bigint * interval '1 millisecond' \
            AND (SELECT got FROM gate) \
        ORDER BY finished_at LIMIT $4 FOR UPDATE SKIP LOCKED \
    ) \
    DELETE FROM workflow_status w USING old \
    WHERE w.shard_key = old.shard_key AND w.id = old.id";
