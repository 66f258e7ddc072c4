//! Per-queue reads and changes: pending work, finished counts, pausing and
//! resuming (`shardq_paused_queues`; the claim function reads it itself),
//! and the server's connection use.

/// Whether queue $1 has any queued, waiting, running or retrying (scheduled
/// after a failure) job on this shard. Each test names what its partial
/// index needs (waiting jobs always have a key; scheduled ones are in
/// `workflow_status_scheduled_by_kind` by queue and attempts), so each is one probe but the
/// running one, which walks the running rows (the lease index, from the
/// lease floor: `at_or_past_lease_floor!`) until it
/// finds one of this queue: at most what the fleet holds. (The planner
/// takes a queue's share of the whole table for its share of the scheduled
/// rows and, with many finished rows of the queue, prefers walking every
/// scheduled row; the ORDER BY ... LIMIT 1 of a scalar subquery, which EXISTS would
/// drop, makes the probe the cheap plan.)
pub const QUEUE_HAS_PENDING: &str = concat!(
    "SELECT (EXISTS (SELECT 1 FROM workflow_status \
        WHERE queue = $1 AND ordering_key IS NULL AND job_group IS NULL AND status = 'queued') \
    OR EXISTS (SELECT 1 FROM workflow_status \
        WHERE queue = $1 AND job_group IS NOT NULL AND status = 'queued') \
    OR EXISTS (SELECT 1 FROM workflow_status \
        WHERE queue = $1 AND ordering_key IS NOT NULL AND status IN ('queued', 'waiting') \
            AND hashtext(ordering_key) IS NOT NULL) \
    OR EXISTS (SELECT 1 FROM workflow_status WHERE queue = $1 AND status = 'running' AND ",
    at_or_past_lease_floor!("lease_expires_at"),
    ") \
    OR coalesce((SELECT true FROM workflow_status \
        WHERE queue = $1 AND status = 'scheduled' AND attempts > 0 \
        ORDER BY queue, attempts LIMIT 1), false)) AS pending"
);

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

/// The server's client connections: shardq's own, shardq's user pool's, all,
/// and `max_connections`.
pub const SERVER_CONNECTIONS: &str = "SELECT \
        count(*) FILTER (WHERE application_name = 'shardq') AS shardq, \
        count(*) FILTER (WHERE application_name = 'shardq-user') AS user_pool, \
        count(*) AS total, current_setting('max_connections')::bigint AS max_connections \
    FROM pg_stat_activity WHERE backend_type = 'client backend'";

/// Pauses queue $1 on this shard (no change when it is paused already):
/// one row inserted when it was running.
pub const QUEUE_PAUSE: &str = "INSERT INTO shardq_paused_queues (queue) VALUES ($1) \
    ON CONFLICT (queue) DO NOTHING";

/// Resumes queue $1 on this shard and, when it was paused, notifies
/// `shardq_ready` so idle workers claim from it at once rather than at their
/// next poll. Returns a row when it was paused.
pub const QUEUE_RESUME: &str = "WITH resumed AS ( \
        DELETE FROM shardq_paused_queues WHERE queue = $1 RETURNING queue \
    ) SELECT pg_notify('shardq_ready', queue) FROM resumed";

/// The paused queues of this shard, with when each was paused.
pub const QUEUE_PAUSED: &str = "SELECT queue, paused_at::text AS paused_at \
    FROM shardq_paused_queues ORDER BY queue";
