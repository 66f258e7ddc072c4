//! SQL fragments that more than one statement shares, as macros that expand
//! to string literals (so each statement stays one `&'static str`).

/// CTEs `keyed`, `locked` and `free` over CTE `$jobs` (columns `shard_key`,
/// `id`, `queue`, `ordering_key`): tries the key lock of each distinct key
/// among the keyed jobs, at most `$limit` keys, and `free` holds the jobs
/// that may be changed now: the unkeyed ones and those whose key lock was
/// got. Never waits: a key whose lock someone holds is left for a later
/// pass. Each key is tried once (its jobs travel as arrays); the jobs of keys
/// past `$limit` wait for a later pass, since every lock taken is an entry in
/// the server's shared lock table until commit.
macro_rules! try_key_locks {
    ($jobs:literal, $limit:literal) => {
        concat!(
            "keyed AS MATERIALIZED ( \
                SELECT j.queue, j.ordering_key, array_agg(j.shard_key) AS sks, array_agg(j.id) AS ids \
                FROM ", $jobs, " j WHERE j.ordering_key IS NOT NULL \
                GROUP BY j.queue, j.ordering_key LIMIT ", $limit, " \
            ), locked AS MATERIALIZED ( \
                SELECT k.sks, k.ids FROM keyed k \
                WHERE pg_try_advisory_xact_lock(shardq_key_lock(k.queue, k.ordering_key)) \
            ), free AS ( \
                SELECT j.shard_key, j.id FROM ", $jobs, " j WHERE j.ordering_key IS NULL \
                UNION ALL \
                SELECT u.shard_key, u.id FROM locked l \
                CROSS JOIN LATERAL unnest(l.sks, l.ids) AS u(shard_key, id) \
            )"
        )
    };
}

/// Gives the running jobs among ($1 shard keys, $2 ids) that also meet
/// `$still` back to the queue, as a lost attempt: attempt count kept,
/// `waiting` behind their key when they have one, `dead` on the last attempt
/// with the error `$error` (an SQL expression), `cancelled` when asked. Raises
/// the fence, so that a completion from the lost attempt arriving before the
/// next claim is fenced out, not taken for a repeat of its own write. Returns
/// the new status of each row.
macro_rules! return_lost {
    ($error:literal, $still:literal) => {
        concat!(
            "UPDATE workflow_status w SET \
                status = CASE WHEN w.cancel_requested THEN 'cancelled' \
                    WHEN w.attempts >= w.max_attempts THEN 'dead' \
                    WHEN w.ordering_key IS NULL THEN 'queued' ELSE 'waiting' END, \
                error = CASE WHEN w.attempts >= w.max_attempts \
                    THEN ",
            $error,
            " ELSE w.error END, \
                finished_at = CASE WHEN w.cancel_requested OR w.attempts >= w.max_attempts \
                    THEN now() END, \
                owner = NULL, lease_expires_at = NULL, fence = w.fence + 1 \
            FROM unnest($1::int[], $2::bigint[]) AS e(shard_key, id) \
            WHERE w.shard_key = e.shard_key AND w.id = e.id \
                AND w.status = 'running' AND ",
            $still,
            " \
            RETURNING w.id, w.status"
        )
    };
}

/// `$lease` (a running row's `lease_expires_at`) at or past the shard's
/// lease floor: the newest row of `shardq_lease_floor_moves` (migration
/// 51), before which no running job's lease ends (worker upkeep moves
/// it: `LEASE_FLOOR_MOVE` in upkeep.rs). A walk of the running jobs by
/// `workflow_status_lease` then starts there: while a long transaction
/// holds the horizon, the index keeps an expired entry of every job
/// finished since, and only those of the last lease's length and a few
/// seconds lie past the floor. No floor yet: every lease. A running row
/// without a lease (broken: `shardq check` names it, from a branch of its
/// own) is not met; an `OR` for it would turn the index condition into a
/// filter over the whole index.
macro_rules! at_or_past_lease_floor {
    ($lease:literal) => {
        concat!(
            $lease,
            " >= coalesce((SELECT lf.floor_at FROM shardq_lease_floor_moves lf \
                ORDER BY lf.move_seq DESC LIMIT 1), '-infinity')"
        )
    };
}

/// The first queue, in the grouped ready index, with a grouped ready job
/// and meeting `$bound` (on `w.queue`): one probe of its range.
macro_rules! first_grouped_queue {
    ($bound:literal) => {
        concat!(
            "(SELECT min(w.queue) FROM workflow_status w \
                WHERE w.status = 'queued' AND w.job_group IS NOT NULL AND ",
            $bound,
            ")"
        )
    };
}

/// CTEs of a `WITH RECURSIVE` (the last `grouped_queues`: `queue`,
/// `floor_turn`): the queues with grouped ready jobs (only queue `$queue`,
/// an SQL text expression, unless NULL), each with the turn its ready
/// jobs lie at or past. A queue claimed from has its grouped floor
/// (`shardq_group_rounds`, read once as `claimed`); the queues never
/// claimed from (`unclaimed`) are found by a walk of the grouped ready
/// index's queues that probes only the gaps between the claimed ones (a
/// probe from a claimed queue's start would pass every dead entry a held
/// horizon keeps there), from turn 0: nothing was claimed from them.
macro_rules! grouped_queues {
    ($queue:literal) => {
        concat!(
            "claimed AS MATERIALIZED ( \
                SELECT g.queue, g.floor_turn FROM shardq_group_rounds g WHERE ",
            $queue,
            " IS NULL \
            ), grouped_gaps AS MATERIALIZED ( \
                SELECT lag(c.queue) OVER (ORDER BY c.queue) AS lo, c.queue AS hi FROM claimed c \
                UNION ALL SELECT max(c.queue), NULL FROM claimed c \
            ), unclaimed (queue, hi) AS ( \
                SELECT CASE WHEN b.lo IS NULL AND b.hi IS NULL THEN ",
            first_grouped_queue!("true"),
            " WHEN b.lo IS NULL THEN ",
            first_grouped_queue!("w.queue < b.hi"),
            " WHEN b.hi IS NULL THEN ",
            first_grouped_queue!("w.queue > b.lo"),
            " ELSE ",
            first_grouped_queue!("w.queue > b.lo AND w.queue < b.hi"),
            " END, b.hi FROM grouped_gaps b WHERE ",
            $queue,
            " IS NULL \
                UNION ALL SELECT CASE WHEN u.hi IS NULL THEN ",
            first_grouped_queue!("w.queue > u.queue"),
            " ELSE ",
            first_grouped_queue!("w.queue > u.queue AND w.queue < u.hi"),
            " END, u.hi FROM unclaimed u WHERE u.queue IS NOT NULL \
            ), grouped_queues AS ( \
                SELECT c.queue, c.floor_turn FROM claimed c \
                UNION ALL SELECT g.queue, g.floor_turn FROM shardq_group_rounds g \
                    WHERE g.queue = ",
            $queue,
            " UNION ALL SELECT u.queue, 0 FROM unclaimed u WHERE u.queue IS NOT NULL \
                UNION ALL SELECT ",
            $queue,
            ", 0 WHERE ",
            $queue,
            " IS NOT NULL AND NOT EXISTS ( \
                    SELECT FROM shardq_group_rounds g WHERE g.queue = ",
            $queue,
            ")) "
        )
    };
}
