//! A queue's recent failures grouped by error (the dashboard's queue page).

/// The dead and failed jobs of queue $1 that finished in the last $2
/// seconds, at most $3 of them, newest first, grouped by their error's
/// first line with its digits folded (`attempt 3 of 5` and `attempt 4 of
/// 5` are one error): per group, how many, the newest one's time (µs since
/// the epoch), error text and job. A backward range of
/// `workflow_status_failed` (migration 9): it reads the failures of the
/// span, never the succeeded history, and stops at $3.
pub const FAILURES_BY_ERROR: &str = "WITH f AS MATERIALIZED ( \
        SELECT shard_key, id, finished_at, coalesce(error, '') AS error \
        FROM workflow_status \
        WHERE status IN ('dead', 'failed') AND queue = $1 \
            AND finished_at >= now() - $2::bigint * interval '1 second' \
        ORDER BY finished_at DESC, id DESC LIMIT $3 \
    ), g AS ( \
        SELECT regexp_replace(left(split_part(error, E'\\n', 1), 300), '[0-9]+', 'N', 'g') AS kind, \
            shard_key, id, finished_at, error FROM f \
    ) \
    SELECT DISTINCT ON (kind) kind, count(*) OVER (PARTITION BY kind) AS n, \
        (extract(epoch FROM finished_at) * 1000000)::bigint AS last_us, \
        left(error, 1000) AS error, shard_key, id \
    FROM g ORDER BY kind, finished_at DESC, id DESC";
