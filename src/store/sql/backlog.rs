//! How deep each queue is: the one read of queue depth by state (and the age
//! of each queue's oldest ready job) that the metrics exporter, `shardq
//! status`, the dashboard and `Client::depth` share. Every branch reads a
//! partial index that holds no finished row, so the cost follows the backlog
//! (ready, waiting, scheduled and running rows), never the history.

/// Per queue (only queue $1; every queue when $1 is NULL): the count of jobs
/// in each unfinished state (`queued`,
/// `waiting`, `retrying`, `delayed`, `parked`, `running`), and for `queued` the age in
/// seconds of its lowest-id ready job: the one enqueued first, measured from
/// when it became ready (`run_at`).
///
/// The ready rows are counted from the three dequeue indexes (plain,
/// keyed, grouped: each holds queue, priority, id), index only, grouped by (queue, priority) with their lowest
/// id; the lowest of those ids per queue is then looked up by the same
/// index with its full key (one probe, one heap row; a grouped one by the
/// primary key, whose first column is the id), since those indexes hold no
/// time. The other states are read from their own partial indexes
/// (waiting jobs always have a key: `workflow_status_key`; scheduled ones by
/// queue, attempts and the parked mark: `workflow_status_scheduled_by_kind`;
/// running ones: the lease index).
/// `$1 IS NULL` is folded away when the statement is planned for its value
/// (the unnamed statement always is), so a named queue is an index range.
pub const QUEUE_BACKLOG: &str = "WITH ready AS ( \
        SELECT queue, priority, kind, count(*) AS n, min(id) AS first_id FROM ( \
            SELECT queue, priority, id, 0 AS kind FROM workflow_status \
                WHERE status = 'queued' AND ordering_key IS NULL AND job_group IS NULL \
                    AND ($1::text IS NULL OR queue = $1::text) \
            UNION ALL SELECT queue, priority, id, 1 FROM workflow_status \
                WHERE status = 'queued' AND ordering_key IS NOT NULL \
                    AND ($1::text IS NULL OR queue = $1::text) \
            UNION ALL SELECT queue, priority, id, 2 FROM workflow_status \
                WHERE status = 'queued' AND job_group IS NOT NULL \
                    AND ($1::text IS NULL OR queue = $1::text) \
        ) r GROUP BY 1, 2, 3 \
    ), heads AS ( \
        SELECT DISTINCT ON (queue) queue, priority, kind, first_id FROM ready \
        ORDER BY queue, first_id \
    ) \
    SELECT h.queue, 'queued' AS state, \
        (SELECT sum(n) FROM ready WHERE ready.queue = h.queue)::bigint AS count, \
        extract(epoch FROM now() - coalesce( \
            (SELECT w.run_at FROM workflow_status w \
                WHERE h.kind = 0 AND w.status = 'queued' AND w.ordering_key IS NULL \
                  AND w.job_group IS NULL \
                  AND w.queue = h.queue AND w.priority = h.priority AND w.id = h.first_id), \
            (SELECT w.run_at FROM workflow_status w \
                WHERE h.kind = 1 AND w.status = 'queued' AND w.ordering_key IS NOT NULL \
                  AND w.queue = h.queue AND w.priority = h.priority AND w.id = h.first_id), \
            (SELECT w.run_at FROM workflow_status w \
                WHERE h.kind = 2 AND w.id = h.first_id AND w.status = 'queued' \
                  AND w.job_group IS NOT NULL AND w.queue = h.queue LIMIT 1) \
        ))::float8 AS oldest_ready_s \
    FROM heads h \
    UNION ALL \
    SELECT queue, state, count(*), NULL FROM ( \
        SELECT queue, 'waiting' AS state FROM workflow_status \
            WHERE status = 'waiting' AND ordering_key IS NOT NULL \
                AND hashtext(ordering_key) IS NOT NULL \
        UNION ALL SELECT queue, CASE WHEN parked THEN 'parked' \
                WHEN attempts > 0 THEN 'retrying' ELSE 'delayed' END \
            FROM workflow_status WHERE status = 'scheduled' \
        UNION ALL SELECT queue, 'running' FROM workflow_status WHERE status = 'running' \
    ) unfinished WHERE ($1::text IS NULL OR queue = $1::text) GROUP BY 1, 2";
