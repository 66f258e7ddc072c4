//! Per-shard upkeep: lease recovery, promotion of due jobs, retention. Each
//! statement first tries its own transaction-level advisory lock ($1 class,
//! $2 slot: `store::locks`), so one process at a time does each job on a
//! shard and the others skip it.

/// Takes upkeep lock ($1, $2) for this transaction; `got` is false when
/// another process holds it.
pub const UPKEEP_GATE: &str = "SELECT pg_try_advisory_xact_lock($1::int, $2::int) AS got";

/// Up to $1 running jobs whose lease expired (owner crashed or hung), oldest
/// first, locked. Rows locked now are skipped: their completion (or a lease
/// extension) is being written, and recovery must never wait, since it takes
/// the key locks next and only tries them (so holding these row locks while
/// it does cannot deadlock with a completion that holds a key lock and waits
/// for one of these rows: the try fails, the pass skips that key, commits).
pub const JOB_FIND_EXPIRED: &str = "SELECT shard_key, id FROM workflow_status \
    WHERE status = 'running' AND lease_expires_at < now() \
    ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED";

/// Tries the key locks of the jobs among ($1 shard keys, $2 ids), at most $3
/// distinct keys, and returns the jobs it may change now: the unkeyed ones
/// and those whose key lock it got. Never waits: a key whose lock someone
/// holds (a frozen worker's open transaction, say) is left for a later pass
/// instead of stopping this one. Run first in the transaction that changes
/// the jobs, so that the statements after it see every change made under
/// those locks. Each key is tried once (its jobs travel as arrays), and the
/// jobs of keys past $3 wait for a later pass: every lock taken is an entry
/// in the server's shared lock table until commit.
pub const KEYS_TRY_LOCK: &str = "WITH jobs AS MATERIALIZED ( \
        SELECT w.shard_key, w.id, w.queue, w.ordering_key \
        FROM unnest($1::int[], $2::bigint[]) AS j(shard_key, id) \
        JOIN workflow_status w ON w.shard_key = j.shard_key AND w.id = j.id \
    ), keyed AS MATERIALIZED ( \
        SELECT j.queue, j.ordering_key, array_agg(j.shard_key) AS sks, array_agg(j.id) AS ids \
        FROM jobs j WHERE j.ordering_key IS NOT NULL \
        GROUP BY j.queue, j.ordering_key LIMIT $3 \
    ), locked AS MATERIALIZED ( \
        SELECT k.sks, k.ids FROM keyed k \
        WHERE pg_try_advisory_xact_lock(shardq_key_lock(k.queue, k.ordering_key)) \
    ) \
    SELECT j.shard_key, j.id FROM jobs j WHERE j.ordering_key IS NULL \
    UNION ALL \
    SELECT u.shard_key, u.id FROM locked l CROSS JOIN LATERAL unnest(l.sks, l.ids) AS u(shard_key, id)";

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
/// upkeep lock ($1, $2). A keyed job is made ready only under its key's
/// lock, tried (at most $4 distinct keys): a key whose lock is held now is
/// promoted by a later pass.
///
/// Why the key lock: `shardq_claim_keyed` (migrations/functions/) decides in one
/// statement, under the key lock, that a key is busy (a job of it running
/// or scheduled) and parks the key's queued jobs as `waiting` in a later
/// one. A promotion that queued the key's scheduled job in between was
/// parked with them, and the key was left with `waiting` jobs only: nothing
/// ever queued it again (tests/promotion_race.rs). With the lock tried here,
/// the two exclude each other: a claim that holds the key makes this pass
/// skip it; a promotion that holds it makes the claim leave the key's head
/// for a later claim, whose statements, run after the promotion committed,
/// see the job queued. Writers that still take no key lock between the
/// claim's statements: enqueue, which only adds a `queued` job (parked
/// behind the busy key, or met by the next claim) or a `scheduled` one (it
/// makes a key busier, never frees it); and this statement itself for
/// unkeyed jobs, which have no key to strand. A job locked by this
/// statement (`FOR UPDATE`) while it tries the key lock cannot deadlock:
/// the try never waits.
pub const JOB_PROMOTE_DUE: &str = "WITH gate AS MATERIALIZED ( \
        SELECT pg_try_advisory_xact_lock($1::int, $2::int) AS got \
    ), due AS MATERIALIZED ( \
        SELECT shard_key, id, queue, ordering_key FROM workflow_status \
        WHERE status = 'scheduled' AND run_at <= now() AND (SELECT got FROM gate) \
        ORDER BY run_at LIMIT $3 FOR UPDATE SKIP LOCKED \
    ), keyed AS MATERIALIZED ( \
        SELECT d.queue, d.ordering_key, array_agg(d.shard_key) AS sks, array_agg(d.id) AS ids \
        FROM due d WHERE d.ordering_key IS NOT NULL \
        GROUP BY d.queue, d.ordering_key LIMIT $4 \
    ), locked AS MATERIALIZED ( \
        SELECT k.sks, k.ids FROM keyed k \
        WHERE pg_try_advisory_xact_lock(shardq_key_lock(k.queue, k.ordering_key)) \
    ), ready AS ( \
        SELECT d.shard_key, d.id FROM due d WHERE d.ordering_key IS NULL \
        UNION ALL \
        SELECT u.shard_key, u.id FROM locked l CROSS JOIN LATERAL unnest(l.sks, l.ids) AS u(shard_key, id) \
    ) \
    UPDATE workflow_status w SET status = 'queued' \
    FROM ready WHERE w.shard_key = ready.shard_key AND w.id = ready.id \
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
