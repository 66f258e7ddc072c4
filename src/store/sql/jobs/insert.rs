//! Enqueueing jobs.
//!
//! Every statement that makes a job ready sends `NOTIFY shardq_ready` with
//! the queue's name (delivered at commit, and PostgreSQL folds the copies of
//! one transaction into one), so idle workers listening on the shard wake at
//! once instead of at their next poll.

/// Inserts many jobs in one statement; returns their ids in input order. A
/// job with a positive delay ($7, ms) starts `scheduled`; $9: the groups;
/// $10: the timeouts in ms (NULL: no deadline), the deadline being the
/// shard's `now()` plus the timeout (`NewJob::timeout`). Every insert below
/// writes the deadline alike, its timeouts the last parameter.
#[cfg(feature = "internal")]
pub const JOB_INSERT_MANY: &str = "INSERT INTO workflow_status \
    (shard_key, queue, handler, ordering_key, priority, payload, status, run_at, max_attempts, \
     job_group, deadline_at) \
    SELECT shard_key, queue, handler, ordering_key, priority, payload, \
        CASE WHEN delay_ms > 0 THEN 'scheduled' ELSE 'queued' END, \
        now() + delay_ms * interval '1 millisecond', max_attempts, job_group, \
        now() + timeout_ms * interval '1 millisecond' \
    FROM unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::int[], $6::jsonb[], \
                $7::bigint[], $8::int[], $9::text[], $10::bigint[]) \
        WITH ORDINALITY AS t(shard_key, queue, handler, ordering_key, priority, payload, \
                             delay_ms, max_attempts, job_group, timeout_ms, ord) \
    ORDER BY ord \
    RETURNING id, \
        CASE WHEN status = 'queued' THEN pg_notify('shardq_ready', queue) END AS woken";

/// [`JOB_INSERT_MANY`] fenced by the epoch of the map the rows were routed
/// by ($9; NULL: the shard's current one; the groups are $10) as [`JOB_INSERT_MANY_AS`], for an
/// insert inside the caller's own transaction.
pub const JOB_INSERT_MANY_FENCED: &str = "WITH fence AS MATERIALIZED ( \
        SELECT shardq_check_route($9::int, VARIADIC $1::int[]) AS ok) \
    INSERT INTO workflow_status \
    (shard_key, queue, handler, ordering_key, priority, payload, status, run_at, max_attempts, \
     job_group, deadline_at) \
    SELECT shard_key, queue, handler, ordering_key, priority, payload, \
        CASE WHEN delay_ms > 0 THEN 'scheduled' ELSE 'queued' END, \
        now() + delay_ms * interval '1 millisecond', max_attempts, job_group, \
        now() + timeout_ms * interval '1 millisecond' \
    FROM fence, unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::int[], $6::jsonb[], \
                $7::bigint[], $8::int[], $10::text[], $11::bigint[]) \
        WITH ORDINALITY AS t(shard_key, queue, handler, ordering_key, priority, payload, \
                             delay_ms, max_attempts, job_group, timeout_ms, ord) \
    WHERE fence.ok \
    ORDER BY ord \
    RETURNING id, \
        CASE WHEN status = 'queued' THEN pg_notify('shardq_ready', queue) END AS woken";

/// Takes $1 job ids from the table's identity sequence (`shardq_reserve_ids`, migrations/functions/), for
/// [`JOB_INSERT_MANY_AS`]: one row, an array in the order taken.
pub const JOB_RESERVE_IDS: &str = "SELECT shardq_reserve_ids($1::int) AS ids";

/// The columns and source rows of [`JOB_INSERT_MANY_AS`] and
/// [`JOB_INSERT_MANY_AGAIN`]: [`JOB_INSERT_MANY`] with the ids given ($1),
/// fenced by the epoch of the map the keys were routed by ($10; NULL: the
/// shard's current one; the groups are $11): `shardq_check_route` raises SQ004 (stale map) or
/// SQ001 (a key not on this shard) before any row is written, and holds
/// the map's lock shared until the transaction ends.
macro_rules! insert_many_as {
    ($on_conflict:literal) => {
        concat!(
            "WITH fence AS MATERIALIZED ( \
                SELECT shardq_check_route($10::int, VARIADIC $2::int[]) AS ok) \
            INSERT INTO workflow_status \
            (id, shard_key, queue, handler, ordering_key, priority, payload, status, run_at, \
             max_attempts, job_group, deadline_at) \
            OVERRIDING SYSTEM VALUE \
            SELECT id, shard_key, queue, handler, ordering_key, priority, payload, \
                CASE WHEN delay_ms > 0 THEN 'scheduled' ELSE 'queued' END, \
                now() + delay_ms * interval '1 millisecond', max_attempts, job_group, \
                now() + timeout_ms * interval '1 millisecond' \
            FROM fence, unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::text[], \
                        $6::int[], $7::jsonb[], $8::bigint[], $9::int[], $11::text[], \
                        $12::bigint[]) \
                WITH ORDINALITY AS t(id, shard_key, queue, handler, ordering_key, priority, \
                                     payload, delay_ms, max_attempts, job_group, timeout_ms, ord) \
            WHERE fence.ok \
            ORDER BY ord ",
            $on_conflict,
            " RETURNING id, \
                CASE WHEN status = 'queued' THEN pg_notify('shardq_ready', queue) END AS woken"
        )
    };
}

/// The first try of an enqueue: [`JOB_INSERT_MANY`] with ids taken by
/// [`JOB_RESERVE_IDS`] ($1), which no row has yet. No ON CONFLICT: a
/// speculative insert costs a WAL record and CPU per row, and nothing can
/// conflict. Should this statement reach the server only after a retry wrote
/// its rows (sent before the connection broke, to a frozen server), it fails
/// on the primary key and writes nothing.
pub const JOB_INSERT_MANY_AS: &str = insert_many_as!("");

/// A retry of [`JOB_INSERT_MANY_AS`]: a row whose id exists already (an
/// earlier try committed, its reply lost) is skipped, so each job is written
/// once. An earlier try still running is waited for by the primary key's
/// uniqueness check, then its rows are skipped if it committed and written
/// if it did not.
pub const JOB_INSERT_MANY_AGAIN: &str = insert_many_as!("ON CONFLICT (id, shard_key) DO NOTHING");

/// Inserts one job with a deduplication id ($9) as job $10 (from
/// [`JOB_RESERVE_IDS`]), skipped when that id exists already (a retry after
/// a lost reply) or an unfinished job of the queue has the deduplication id.
/// Returns the id when this statement wrote it ($12: the group). Fenced by epoch $11 as
/// [`JOB_INSERT_MANY_AS`].
pub const JOB_INSERT_DEDUP_AS: &str = "WITH fence AS MATERIALIZED ( \
        SELECT shardq_check_route($11::int, $1::int) AS ok) \
    INSERT INTO workflow_status \
    (shard_key, queue, handler, ordering_key, priority, payload, status, run_at, max_attempts, \
     dedup_id, id, job_group, deadline_at) \
    OVERRIDING SYSTEM VALUE \
    SELECT $1, $2, $3, $4, $5, $6, CASE WHEN $7::bigint > 0 THEN 'scheduled' ELSE 'queued' END, \
        now() + $7::bigint * interval '1 millisecond', $8, $9, $10, $12, \
        now() + $13::bigint * interval '1 millisecond' \
    FROM fence WHERE fence.ok \
    ON CONFLICT DO NOTHING \
    RETURNING id, \
        CASE WHEN status = 'queued' THEN pg_notify('shardq_ready', queue) END AS woken";

/// The unfinished job of queue $1 with deduplication id $2.
pub const JOB_FIND_DEDUP: &str = "SELECT shard_key, id FROM workflow_status \
    WHERE queue = $1 AND dedup_id = $2 AND status IN ('scheduled', 'queued', 'running', 'held')";

/// The ready floors of the queues ($1) and priorities ($2, pairwise) that
/// lack them, made before their first job is written
/// (`shardq_ensure_floors`: the rights of the schema's owner, as the
/// trigger that otherwise makes them).
pub const READY_FLOORS_ENSURE: &str = "SELECT shardq_ensure_floors($1::text[], $2::int[])";
