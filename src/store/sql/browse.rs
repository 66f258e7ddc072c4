//! Reading many jobs for operators (the dashboard): lists by state, paged by
//! keyset, each read through the partial index of its state; counts of
//! failed jobs; completions per time bucket; the age of the oldest ready job.
//!
//! The list statements share their parameters: $1 queue, $2 handler, $3
//! ordering key (each NULL for any), $4..$7 the position to continue after
//! ($4 NULL on the first page; `pos_text`, `pos_text2`, `pos_num`, `id` of
//! the last row shown), $8 the page size, $9 the state they read. Each
//! returns the job summary and its position. Keyset, never OFFSET: a page
//! costs its own rows, however deep it is. ORDER BY names the table's
//! columns (`workflow_status.run_at`): a bare name would sort by the
//! summary's text column of the same name (tests/browse_plans.rs).

/// The columns of a job summary.
macro_rules! summary {
    () => {
        "shard_key, id, queue, handler, ordering_key, status, attempts, max_attempts, \
         left(error, 300) AS error, created_at::text AS created_at, run_at::text AS run_at, \
         finished_at::text AS finished_at"
    };
}

/// A job's filters (queue, handler, key), for every list.
macro_rules! filters {
    () => {
        "($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR handler = $2) \
         AND ($3::text IS NULL OR ordering_key = $3)"
    };
}

/// One branch of the ready list: the ready jobs that meet `$which`, by the
/// dequeue index that holds them.
macro_rules! ready_branch {
    ($which:literal) => {
        concat!(
            "(SELECT ",
            summary!(),
            ", queue AS pos_text, '' AS pos_text2, priority::bigint AS pos_num \
             FROM workflow_status WHERE status = 'queued' AND ",
            $which,
            " AND ",
            filters!(),
            " AND ($4::text IS NULL OR (queue, priority, id) > ($4, $6::int, $7)) \
             ORDER BY queue, priority, id LIMIT $8)"
        )
    };
}

/// Ready jobs in (queue, priority, id) order: the plain and the keyed
/// dequeue index each give their first rows in order, merged here; the
/// grouped jobs are read by turn (`workflow_status_ready_grouped`, the one
/// grouped index such a read can use), so their branch sorts the ready
/// grouped jobs of the queues shown (all of them).
pub const JOBS_READY: &str = concat!(
    "SELECT * FROM (",
    ready_branch!("ordering_key IS NULL AND job_group IS NULL"),
    " UNION ALL ",
    ready_branch!("ordering_key IS NOT NULL"),
    " UNION ALL ",
    ready_branch!("job_group IS NOT NULL"),
    ") ready ORDER BY pos_text, pos_num, id LIMIT $8"
);

/// Jobs parked behind their key, by (queue, key, id): the key index
/// `workflow_status_key` (queue, ordering_key, status, id) with the status
/// fixed.
pub const JOBS_WAITING: &str = concat!(
    "SELECT ",
    summary!(),
    ", queue AS pos_text, ordering_key AS pos_text2, 0::bigint AS pos_num \
     FROM workflow_status WHERE status = 'waiting' AND ordering_key IS NOT NULL \
     AND hashtext(ordering_key) IS NOT NULL AND ",
    filters!(),
    " AND ($4::text IS NULL OR (queue, ordering_key, status, id) > ($4, $5, 'waiting', $7)) \
     ORDER BY queue, ordering_key, status, id LIMIT $8"
);

/// The position of a row ordered by timestamp `$col`: microseconds since the
/// epoch, exact (an integer both ways).
macro_rules! micros {
    ($col:literal) => {
        concat!(
            "'' AS pos_text, '' AS pos_text2, (extract(epoch FROM ",
            $col,
            ") * 1000000)::bigint AS pos_num"
        )
    };
}

/// Jobs not due yet, next due first (`workflow_status_scheduled` on
/// run_at): $9 `parked` for parked workflows, `retrying` for the others
/// that failed before, `scheduled` for delayed ones that never ran.
pub const JOBS_SCHEDULED: &str = concat!(
    "SELECT ",
    summary!(),
    ", ",
    micros!("run_at"),
    " FROM workflow_status WHERE status = 'scheduled' \
     AND CASE WHEN parked THEN 'parked' WHEN attempts > 0 THEN 'retrying' \
        ELSE 'scheduled' END = $9::text AND ",
    filters!(),
    " AND ($4::text IS NULL OR (run_at, id) > \
        (timestamptz 'epoch' + $6::bigint * interval '1 microsecond', $7)) \
     ORDER BY workflow_status.run_at, workflow_status.id LIMIT $8"
);

/// Running jobs, the lease that expires first first (`workflow_status_lease`).
pub const JOBS_RUNNING: &str = concat!(
    "SELECT ",
    summary!(),
    ", ",
    micros!("lease_expires_at"),
    " FROM workflow_status WHERE status = 'running' AND ",
    at_or_past_lease_floor!("lease_expires_at"),
    " AND ",
    filters!(),
    " AND ($4::text IS NULL OR (lease_expires_at, id) > \
        (timestamptz 'epoch' + $6::bigint * interval '1 microsecond', $7)) \
     ORDER BY workflow_status.lease_expires_at, workflow_status.id LIMIT $8"
);

/// Finished jobs of state $9, newest first: succeeded ones through
/// `workflow_status_finished`, dead, failed and cancelled ones through
/// `workflow_status_failed` (migration 9), both on finished_at.
pub const JOBS_FINISHED: &str = concat!(
    "SELECT ",
    summary!(),
    ", ",
    micros!("finished_at"),
    " FROM workflow_status WHERE status = $9 AND ",
    filters!(),
    " AND ($4::text IS NULL OR (finished_at, id) < \
        (timestamptz 'epoch' + $6::bigint * interval '1 microsecond', $7)) \
     ORDER BY workflow_status.finished_at DESC, workflow_status.id DESC LIMIT $8"
);

/// Dead, failed and cancelled jobs by queue and state, each pair counted
/// up to $1 jobs, from `workflow_status_failed_queue` alone (migration
/// 25). The pairs are found by skipping through that index, one descent
/// each, and each count reads at most $1 of its entries: the read costs
/// the pairs times $1 however many such jobs retention keeps, and
/// succeeded history is not walked.
pub const FAILED_COUNTS: &str = "WITH RECURSIVE pairs AS ( \
        (SELECT status, queue FROM workflow_status \
         WHERE status IN ('dead', 'failed', 'cancelled') ORDER BY status, queue LIMIT 1) \
        UNION ALL \
        SELECT later.status, later.queue FROM pairs CROSS JOIN LATERAL ( \
            SELECT status, queue FROM workflow_status \
            WHERE status IN ('dead', 'failed', 'cancelled') \
                AND (status, queue) > (pairs.status, pairs.queue) \
            ORDER BY status, queue LIMIT 1) later \
    ) \
    SELECT pairs.queue, pairs.status AS state, counted.n AS count \
    FROM pairs CROSS JOIN LATERAL ( \
        SELECT count(*) AS n FROM ( \
            SELECT FROM workflow_status \
            WHERE status IN ('dead', 'failed', 'cancelled') \
                AND status = pairs.status AND queue = pairs.queue \
            LIMIT $1::bigint) capped \
    ) counted ORDER BY 1, 2";

/// Jobs finished in the last $2 seconds by queue and age bucket of $1
/// seconds (0: the newest). A range of `workflow_status_finished`: it reads
/// the rows of the window, never the older history.
pub const COMPLETIONS_RECENT: &str = "SELECT queue, \
        floor(extract(epoch FROM now() - finished_at) / $1::bigint)::bigint AS ago, count(*) \
    FROM workflow_status \
    WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled') \
        AND finished_at >= now() - $2::bigint * interval '1 second' \
    GROUP BY 1, 2 ORDER BY 1, 2";

/// The head of one dequeue index at one priority level of queue $1.
macro_rules! head {
    ($keyed:literal, $what:literal, $level:literal) => {
        concat!(
            "(SELECT ",
            $what,
            " FROM workflow_status WHERE status = 'queued' AND ordering_key ",
            $keyed,
            " AND queue = $1 ",
            $level,
            " LIMIT 1)"
        )
    };
}

/// Seconds since the longest-waiting ready job of queue $1 became due
/// (NULL when none): the head (lowest id) of each priority level of the
/// plain and keyed dequeue indexes, found by skipping from level to level
/// (one probe each, however many jobs are ready), and the lowest-id grouped
/// one (the grouped jobs are read by turn, so that read walks the queue's
/// ready grouped jobs).
pub const QUEUE_OLDEST_READY: &str = concat!(
    "WITH RECURSIVE levels(keyed, priority) AS ( \
        SELECT false, ",
    head!(
        "IS NULL AND job_group IS NULL",
        "priority",
        "ORDER BY priority"
    ),
    " UNION ALL SELECT true, ",
    head!("IS NOT NULL", "priority", "ORDER BY priority"),
    " UNION ALL SELECT l.keyed, CASE WHEN l.keyed THEN ",
    head!(
        "IS NOT NULL",
        "priority",
        "AND priority > l.priority ORDER BY priority"
    ),
    " ELSE ",
    head!(
        "IS NULL AND job_group IS NULL",
        "priority",
        "AND priority > l.priority ORDER BY priority"
    ),
    " END FROM levels l WHERE l.priority IS NOT NULL \
    ) SELECT extract(epoch FROM now() - least((SELECT min(CASE WHEN l.keyed THEN ",
    head!(
        "IS NOT NULL",
        "run_at",
        "AND priority = l.priority ORDER BY priority, id"
    ),
    " ELSE ",
    head!(
        "IS NULL AND job_group IS NULL",
        "run_at",
        "AND priority = l.priority ORDER BY priority, id"
    ),
    " END) FROM levels l WHERE l.priority IS NOT NULL), \
        (SELECT w.run_at FROM workflow_status w \
         WHERE w.id = (SELECT min(g.id) FROM workflow_status g \
                       WHERE g.queue = $1 AND g.status = 'queued' AND g.job_group IS NOT NULL) \
           AND w.queue = $1 AND w.status = 'queued' AND w.job_group IS NOT NULL LIMIT 1) \
    ))::float8 AS age_s"
);

/// The recorded steps of one workflow, in the order they were recorded.
pub const STEPS_OF_JOB: &str = "SELECT step_name, output, error, created_at::text AS created_at \
    FROM workflow_steps WHERE shard_key = $1 AND workflow_id = $2 \
    ORDER BY created_at, step_name";

/// Per queue, the jobs that finished after $1 (NULL: 10 s before the end)
/// and up to 5 s before this statement's now() (the end), and of those the
/// ones that ended dead or failed (one row: arrays by queue, NULL when
/// none finished), with the span read (`from_at`, `at`: the next read's
/// $1). The
/// lag: `finished_at` is a completion transaction's start, so a span read
/// up to now() would pass over completions still committing and never
/// count them. The bound: a span starts at most $2 ms before the end, so
/// after a long gap a read skips to the last $2 ms (`from_at` later than
/// $1) instead of growing with the gap (a read that grew would miss its
/// deadline, and every later one, larger still, too). The end never falls
/// before $1 (a clock stepped back): nothing is read twice. A range of
/// `workflow_status_finished`: it reads the rows of the span, never the
/// older history.
pub const FINISHED_SINCE: &str = "WITH e AS ( \
        SELECT greatest($1::timestamptz, now() - interval '5 seconds') AS at \
    ), t AS ( \
        SELECT greatest(coalesce($1::timestamptz, e.at - interval '10 seconds'), \
            e.at - $2::bigint * interval '1 millisecond') AS from_at, e.at FROM e \
    ) \
    SELECT t.from_at, t.at, c.queues, c.done, c.failed FROM t CROSS JOIN LATERAL ( \
        SELECT array_agg(g.queue) AS queues, array_agg(g.done) AS done, \
            array_agg(g.failed) AS failed \
        FROM (SELECT queue, count(*) AS done, \
                count(*) FILTER (WHERE status IN ('dead', 'failed')) AS failed \
            FROM workflow_status \
            WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled') \
                AND finished_at > t.from_at AND finished_at <= t.at \
            GROUP BY queue) g) c";

/// Gives up this transaction's statements after $1 ms (as text) on the
/// server too: a read its caller abandoned at a deadline does not run on.
pub const DEADLINE_LOCAL: &str = "SELECT set_config('statement_timeout', $1::text, true)";
