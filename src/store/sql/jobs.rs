//! Enqueueing, reading and changing single jobs.
//!
//! Every statement that makes a job ready sends `NOTIFY shardq_ready` with
//! the queue's name (delivered at commit, and PostgreSQL folds the copies of
//! one transaction into one), so idle workers listening on the shard wake at
//! once instead of at their next poll.

/// Inserts many jobs in one statement; returns their ids in input order. A
/// job with a positive delay ($7, ms) starts `scheduled`.
pub const JOB_INSERT_MANY: &str = "INSERT INTO workflow_status \
    (shard_key, queue, handler, ordering_key, priority, payload, status, run_at, max_attempts) \
    SELECT shard_key, queue, handler, ordering_key, priority, payload, \
        CASE WHEN delay_ms > 0 THEN 'scheduled' ELSE 'queued' END, \
        now() + delay_ms * interval '1 millisecond', max_attempts \
    FROM unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::int[], $6::jsonb[], \
                $7::bigint[], $8::int[]) \
        WITH ORDINALITY AS t(shard_key, queue, handler, ordering_key, priority, payload, \
                             delay_ms, max_attempts, ord) \
    ORDER BY ord \
    RETURNING id, \
        CASE WHEN status = 'queued' THEN pg_notify('shardq_ready', queue) END AS woken";

/// Takes $1 job ids from the table's identity sequence (`shardq_reserve_ids`, migrations/functions/), for
/// [`JOB_INSERT_MANY_AS`]: one row, an array in the order taken.
pub const JOB_RESERVE_IDS: &str = "SELECT shardq_reserve_ids($1::int) AS ids";

/// The columns and source rows of [`JOB_INSERT_MANY_AS`] and
/// [`JOB_INSERT_MANY_AGAIN`]: [`JOB_INSERT_MANY`] with the ids given ($1).
macro_rules! insert_many_as {
    ($on_conflict:literal) => {
        concat!(
            "INSERT INTO workflow_status \
            (id, shard_key, queue, handler, ordering_key, priority, payload, status, run_at, \
             max_attempts) \
            OVERRIDING SYSTEM VALUE \
            SELECT id, shard_key, queue, handler, ordering_key, priority, payload, \
                CASE WHEN delay_ms > 0 THEN 'scheduled' ELSE 'queued' END, \
                now() + delay_ms * interval '1 millisecond', max_attempts \
            FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::text[], $6::int[], \
                        $7::jsonb[], $8::bigint[], $9::int[]) \
                WITH ORDINALITY AS t(id, shard_key, queue, handler, ordering_key, priority, \
                                     payload, delay_ms, max_attempts, ord) \
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

/// [`JOB_INSERT_DEDUP`] with the id given ($10, from [`JOB_RESERVE_IDS`]):
/// skipped when that id exists already (a retry after a lost reply) or an
/// unfinished job of the queue has the deduplication id. Returns the id when
/// this statement wrote it.
pub const JOB_INSERT_DEDUP_AS: &str = "INSERT INTO workflow_status \
    (shard_key, queue, handler, ordering_key, priority, payload, status, run_at, max_attempts, \
     dedup_id, id) \
    OVERRIDING SYSTEM VALUE \
    VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $7::bigint > 0 THEN 'scheduled' ELSE 'queued' END, \
        now() + $7::bigint * interval '1 millisecond', $8, $9, $10) \
    ON CONFLICT DO NOTHING \
    RETURNING id, \
        CASE WHEN status = 'queued' THEN pg_notify('shardq_ready', queue) END AS woken";

/// Inserts one job with a deduplication id ($9), unless an unfinished job of
/// the same queue has it. Returns the new id, or no row.
pub const JOB_INSERT_DEDUP: &str = "INSERT INTO workflow_status \
    (shard_key, queue, handler, ordering_key, priority, payload, status, run_at, max_attempts, dedup_id) \
    VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $7::bigint > 0 THEN 'scheduled' ELSE 'queued' END, \
        now() + $7::bigint * interval '1 millisecond', $8, $9) \
    ON CONFLICT (queue, dedup_id) \
        WHERE dedup_id IS NOT NULL AND status IN ('scheduled', 'queued', 'running') \
    DO NOTHING \
    RETURNING id, \
        CASE WHEN status = 'queued' THEN pg_notify('shardq_ready', queue) END AS woken";

/// The unfinished job of queue $1 with deduplication id $2.
pub const JOB_FIND_DEDUP: &str = "SELECT shard_key, id FROM workflow_status \
    WHERE queue = $1 AND dedup_id = $2 AND status IN ('scheduled', 'queued', 'running')";

/// Whether queue $1 has any queued, waiting, running or retrying (scheduled
/// after a failure) job on this shard. Each test names what its partial
/// index needs (waiting jobs always have a key; scheduled ones are in
/// `workflow_status_scheduled_queue` by queue), so each is one probe but the
/// running one, which walks the running rows (the lease index) until it
/// finds one of this queue: at most what the fleet holds. (The planner
/// takes a queue's share of the whole table for its share of the scheduled
/// rows and, with many finished rows of the queue, prefers walking every
/// scheduled row; the ORDER BY ... LIMIT 1 of a scalar subquery, which EXISTS would
/// drop, makes the probe the cheap plan.)
pub const QUEUE_HAS_PENDING: &str = "SELECT (EXISTS (SELECT 1 FROM workflow_status \
        WHERE queue = $1 AND ordering_key IS NULL AND status = 'queued') \
    OR EXISTS (SELECT 1 FROM workflow_status \
        WHERE queue = $1 AND ordering_key IS NOT NULL AND status IN ('queued', 'waiting')) \
    OR EXISTS (SELECT 1 FROM workflow_status WHERE queue = $1 AND status = 'running') \
    OR coalesce((SELECT true FROM workflow_status \
        WHERE queue = $1 AND status = 'scheduled' AND attempts > 0 \
        ORDER BY queue, attempts LIMIT 1), false)) AS pending";

/// Unfinished job counts by queue and state; scheduled jobs split into
/// `retrying` (they failed before) and `delayed`. Each branch reads one
/// partial index, so finished rows cost it nothing.
pub const QUEUE_COUNTS: &str = "SELECT queue, state, count(*) FROM ( \
        SELECT queue, 'queued' AS state FROM workflow_status \
            WHERE status = 'queued' AND ordering_key IS NULL \
        UNION ALL SELECT queue, 'queued' FROM workflow_status \
            WHERE status = 'queued' AND ordering_key IS NOT NULL \
        UNION ALL SELECT queue, 'waiting' FROM workflow_status \
            WHERE status = 'waiting' AND ordering_key IS NOT NULL \
        UNION ALL SELECT queue, CASE WHEN attempts > 0 THEN 'retrying' ELSE 'delayed' END \
            FROM workflow_status WHERE status = 'scheduled' \
        UNION ALL SELECT queue, 'running' FROM workflow_status WHERE status = 'running' \
    ) unfinished GROUP BY 1, 2 ORDER BY 1, 2";

/// The planner's estimate of finished rows (all queues), from the table's
/// statistics: free, however many there are.
pub const FINISHED_ESTIMATE: &str = "SELECT coalesce(( \
        SELECT (c.reltuples * coalesce(( \
            SELECT sum(f) FROM pg_stats s, unnest(s.most_common_freqs::text::float8[]) \
                WITH ORDINALITY AS m(f, i) \
            WHERE s.tablename = 'workflow_status' AND s.attname = 'status' \
              AND (s.most_common_vals::text::text[])[m.i] \
                  IN ('succeeded', 'failed', 'dead', 'cancelled')), 0))::bigint \
        FROM pg_class c WHERE c.oid = 'workflow_status'::regclass AND c.reltuples > 0), 0) \
    AS estimate";

/// Finished job counts by queue and status, exact: walks every finished row,
/// so run only when the estimate says there are few.
pub const FINISHED_COUNTS: &str = "SELECT queue, status AS state, count(*) FROM workflow_status \
    WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled') GROUP BY 1, 2 ORDER BY 1, 2";

/// One job by key.
pub const JOB_GET: &str = "SELECT queue, handler, ordering_key, priority, status, payload, \
    output, error, attempts, max_attempts, owner, dedup_id, cancel_requested, \
    created_at::text AS created_at, run_at::text AS run_at, \
    started_at::text AS started_at, finished_at::text AS finished_at \
    FROM workflow_status WHERE shard_key = $1 AND id = $2";

/// The status, output and error of one job.
pub const JOB_OUTCOME: &str = "SELECT status, output, error FROM workflow_status \
    WHERE shard_key = $1 AND id = $2";

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

/// The server's client connections: shardq's own, shardq's user pool's, all,
/// and `max_connections`.
pub const SERVER_CONNECTIONS: &str = "SELECT \
        count(*) FILTER (WHERE application_name = 'shardq') AS shardq, \
        count(*) FILTER (WHERE application_name = 'shardq-user') AS user_pool, \
        count(*) AS total, current_setting('max_connections')::bigint AS max_connections \
    FROM pg_stat_activity WHERE backend_type = 'client backend'";

/// Whether this shard holds job (`$1` shard key, `$2` id): finds the shard of
/// a job written under an older shard map (one primary-key probe).
pub const JOB_EXISTS: &str = "SELECT 1 FROM workflow_status WHERE shard_key = $1 AND id = $2";
