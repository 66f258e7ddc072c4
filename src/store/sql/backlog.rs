//! How deep each queue is: the one read of queue depth by state (and the age
//! of each queue's oldest ready job) that the metrics exporter, `shardq
//! status`, the dashboard and `Client::depth` share. Every branch reads a
//! partial index that holds no finished row, so the cost follows the backlog
//! (ready, waiting, scheduled and running rows), never the finished
//! history; while a long transaction holds the horizon, see
//! [`QUEUE_BACKLOG`] for what grows.

/// The backlog read up to its states other than `queued`: the ready
/// counts and heads (CTEs), the `queued` rows, then the opening of the
/// other states' rows (`unfinished`: queue and state per job), which
/// [`backlog_running!`] and [`backlog_end!`] close.
macro_rules! backlog_ready {
    () => {
        concat!(
            "WITH RECURSIVE ",
            grouped_queues!("$1::text"),
            ", ready AS ( \
                SELECT f.queue, f.priority, k.kind, k.n, k.first FROM shardq_ready_floors f \
                CROSS JOIN LATERAL ( \
            SELECT 0 AS kind, count(*) AS n, min(w.ready_seq) AS first FROM workflow_status w \
                WHERE w.status = 'queued' AND w.ordering_key IS NULL AND w.job_group IS NULL \
                    AND w.queue = f.queue AND w.priority = f.priority \
                    AND w.ready_seq >= f.floor_seq \
            UNION ALL SELECT 1, count(*), min(w.ready_seq) FROM workflow_status w \
                WHERE w.status = 'queued' AND w.ordering_key IS NOT NULL \
                    AND w.queue = f.queue AND w.priority = f.priority \
                    AND w.ready_seq >= f.keyed_floor_seq \
        ) k WHERE ($1::text IS NULL OR f.queue = $1::text) AND k.n > 0 \
        UNION ALL SELECT q.queue, c.priority, 2, c.n, c.first FROM grouped_queues q \
        CROSS JOIN LATERAL ( \
            SELECT x.priority, count(*) AS n, min(x.id) AS first FROM ( \
                SELECT w.priority, w.id FROM workflow_status w \
                    WHERE w.status = 'queued' AND w.job_group IS NOT NULL \
                        AND w.queue = q.queue AND w.turn >= q.floor_turn \
                UNION ALL SELECT w.priority, w.id FROM workflow_status w \
                    WHERE w.status = 'queued' AND w.job_group IS NOT NULL \
                        AND w.queue = q.queue AND w.turn IS NULL \
            ) x GROUP BY x.priority \
        ) c \
    ), heads AS ( \
        SELECT r.queue, r.n, CASE r.kind \
            WHEN 0 THEN (SELECT w.run_at FROM workflow_status w \
                WHERE w.status = 'queued' AND w.ordering_key IS NULL AND w.job_group IS NULL \
                  AND w.queue = r.queue AND w.priority = r.priority AND w.ready_seq = r.first \
                LIMIT 1) \
            WHEN 1 THEN (SELECT w.run_at FROM workflow_status w \
                WHERE w.status = 'queued' AND w.ordering_key IS NOT NULL \
                  AND w.queue = r.queue AND w.priority = r.priority AND w.ready_seq = r.first \
                LIMIT 1) \
            ELSE (SELECT w.run_at FROM workflow_status w \
                WHERE w.id = r.first AND w.status = 'queued' AND w.job_group IS NOT NULL \
                  AND w.queue = r.queue LIMIT 1) END AS run_at \
        FROM ready r \
    ) \
    SELECT queue, 'queued' AS state, sum(n)::bigint AS count, \
        extract(epoch FROM now() - min(run_at))::float8 AS oldest_ready_s \
    FROM heads GROUP BY queue \
    UNION ALL \
    SELECT queue, state, count(*), NULL FROM ( "
        )
    };
}

/// The running jobs' rows of `unfinished`: from the lease floor, and
/// those without a lease (a broken row's).
macro_rules! backlog_running {
    () => {
        concat!(
            "SELECT queue, 'running' AS state FROM workflow_status \
                WHERE status = 'running' AND ",
            at_or_past_lease_floor!("lease_expires_at"),
            " UNION ALL SELECT queue, 'running' FROM workflow_status \
                WHERE status = 'running' AND lease_expires_at IS NULL"
        )
    };
}

/// Closes `unfinished` and counts it by queue and state.
macro_rules! backlog_end {
    () => {
        " ) unfinished WHERE ($1::text IS NULL OR queue = $1::text) GROUP BY 1, 2"
    };
}

/// Per queue (only queue $1; every queue when $1 is NULL): the count of jobs
/// in each unfinished state (`queued`,
/// `waiting`, `retrying`, `delayed`, `parked`, `running`), and for `queued` the age in
/// seconds of its longest-waiting ready job: the oldest `run_at` (when it
/// became due) among the first ready job of each priority and kind.
///
/// Ready jobs without a group are counted from their queue and priority's
/// ready floors (`shardq_ready_floors`: every ready plain or keyed job is
/// numbered at or past its floor, or no claim would find it), one range of
/// `workflow_status_ready_plain` or `_ready_keyed` (queue, priority,
/// ready_seq) each, index only, with the lowest number; so while a long
/// transaction holds the horizon they pass only what was claimed since the
/// floors last moved, as the claims do, not every dead entry behind them.
/// Grouped ones are counted from `workflow_status_ready_grouped` by
/// (queue, priority) with their lowest id, each queue's from its grouped
/// floor (`shardq_group_rounds`; the claims walk from it), and those
/// without a turn yet. A queue's grouped floor exists only once it has
/// been claimed from (`claimed`: the view read once): the queues never
/// claimed from (`unclaimed`) are found by a walk of the index's queues
/// that probes only the gaps between the claimed ones (a probe from a
/// claimed queue's start would pass every dead entry a hold keeps there),
/// and counted from turn 0: nothing was claimed from them. A grouped job
/// below its queue's floor (a broken row: no claim reaches it) is not
/// counted; `shardq check` names it. Every floor is read (a level stays once made), each from
/// its newest row (migration 47: a hold does not lengthen that read), so
/// this part grows with the levels, not with the jobs claimed or the
/// length of a hold. The head of each priority and kind is then looked up
/// by its full key (one probe, one heap row; a grouped one by the primary
/// key, whose first column is the id), since those indexes hold no time.
/// The other states are read from their own partial indexes
/// (waiting jobs always have a key: `workflow_status_key`; scheduled ones by
/// queue, attempts and the parked mark: `workflow_status_scheduled_by_kind`;
/// running ones: the lease index from the lease floor (and its entries
/// without a lease, a broken row's), since, while the
/// horizon is held, it keeps an expired entry of every job run since:
/// those of the last lease's length and a few seconds are still walked,
/// docs/operations.md).
/// `$1 IS NULL` is folded away when the statement is planned for its value
/// (the unnamed statement always is), so a named queue is an index range.
pub const QUEUE_BACKLOG: &str = concat!(
    backlog_ready!(),
    "SELECT queue, 'waiting' AS state FROM workflow_status \
        WHERE status = 'waiting' AND ordering_key IS NOT NULL \
            AND hashtext(ordering_key) IS NOT NULL \
    UNION ALL SELECT queue, CASE WHEN parked THEN 'parked' \
            WHEN attempts > 0 THEN 'retrying' ELSE 'delayed' END \
        FROM workflow_status WHERE status = 'scheduled' \
    UNION ALL ",
    backlog_running!(),
    backlog_end!()
);

/// [`QUEUE_BACKLOG`] without its counts of `waiting` and scheduled jobs
/// (`retrying`, `delayed`, `parked`): the ready and running counts, each
/// read from its floors. While a long transaction holds the horizon,
/// those two counts walk the dead entry of every job that left the state
/// since (a keyed job's versions in `workflow_status_key`, a promoted
/// one's in the scheduled index); this read passes only what the floors
/// do, and is what every reader of queue depth (the exporter, `shardq
/// status`, `Client::depth`, the dashboard) reads when the full one runs
/// past its share of the deadline (`store::backlog::read_within`).
pub const QUEUE_BACKLOG_BOUNDED: &str =
    concat!(backlog_ready!(), backlog_running!(), backlog_end!());
