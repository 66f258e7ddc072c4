//! The job-state invariant's read, [`CHECK_JOB_STATE`], and the same read
//! without its windows from each index's start (of ready, waiting and
//! scheduled jobs), [`CHECK_JOB_STATE_FROM_FLOORS`]. The ready windows
//! find a ready job below its floor (no claim would reach it), and while
//! a long transaction holds the horizon all of them walk the dead entry
//! of every job that left the state since:
//! `store::check` gives the full read a share of the check's deadline and
//! reads from the floors alone (`capped`) past it, so that every check of
//! the shard still answers.

/// The columns each window of the job-state reads returns, after its name.
macro_rules! job_state_columns {
    () => {
        "shard_key, id, queue, ordering_key, status, owner, \
            lease_expires_at, fence, attempts, max_attempts, started_at, finished_at, \
            cancel_requested, held_status, priority, job_group, ready_seq, turn"
    };
}

/// What follows the `visited` windows of a job-state read: each row judged
/// by the rules of [`CHECK_JOB_STATE`], and the one row every check
/// statement returns.
macro_rules! judged_job_states {
    () => {
        "), judged AS ( \
        SELECT v.shard_key, v.id, v.queue, v.ordering_key, CASE \
            WHEN v.status = 'running' THEN CASE \
                WHEN v.owner IS NULL THEN 'running without an owner' \
                WHEN v.lease_expires_at IS NULL THEN 'running without a lease' \
                WHEN v.fence < 1 THEN 'running with fence 0: no claim raised it' \
                WHEN v.started_at IS NULL THEN 'running without started_at' \
                WHEN v.finished_at IS NOT NULL THEN 'running with finished_at set' \
                WHEN v.attempts < 1 OR v.attempts > v.max_attempts \
                    THEN 'running on attempt ' || v.attempts || ' of ' || v.max_attempts \
                END \
            WHEN v.status IN ('waiting', 'queued', 'scheduled') THEN CASE \
                WHEN v.owner IS NOT NULL THEN v.status || ' with an owner (' || v.owner || ')' \
                WHEN v.lease_expires_at IS NOT NULL THEN v.status || ' with a lease' \
                WHEN v.finished_at IS NOT NULL THEN v.status || ' with finished_at set' \
                WHEN v.cancel_requested \
                    THEN v.status || ' with its cancellation asked (only a running job waits on one)' \
                WHEN v.attempts < 0 OR v.attempts >= v.max_attempts \
                    THEN v.status || ' with ' || v.attempts || ' of ' || v.max_attempts \
                        || ' attempts used (it should be dead)' \
                WHEN v.status = 'waiting' AND v.ordering_key IS NULL \
                    THEN 'waiting without an ordering key (nothing ever queues it)' \
                WHEN v.status = 'queued' AND v.job_group IS NULL \
                  AND NOT EXISTS (SELECT 1 FROM shardq_ready_floors f \
                      WHERE f.queue = v.queue AND f.priority = v.priority \
                        AND CASE WHEN v.ordering_key IS NULL THEN f.floor_seq \
                                 ELSE f.keyed_floor_seq END <= v.ready_seq) \
                    THEN 'queued below its ready floor, or without a number or a floor \
                        (no claim reaches it)' \
                WHEN v.status = 'queued' AND v.job_group IS NOT NULL \
                  AND v.turn < coalesce((SELECT r.floor_turn \
                      FROM shardq_group_rounds r WHERE r.queue = v.queue), 0) \
                    THEN 'queued in a group below its grouped floor (no claim reaches it)' \
                END \
            WHEN v.status = 'held' THEN CASE \
                WHEN v.held_status IS NULL \
                  OR v.held_status NOT IN ('waiting', 'scheduled', 'queued', 'running') \
                    THEN 'held without a status to return to' \
                WHEN v.owner IS NOT NULL THEN 'held with an owner (' || v.owner || ')' \
                WHEN v.lease_expires_at IS NOT NULL THEN 'held with a lease' \
                WHEN v.finished_at IS NOT NULL THEN 'held with finished_at set' \
                WHEN v.held_status <> 'running' \
                  AND (v.attempts < 0 OR v.attempts >= v.max_attempts) \
                    THEN 'held with ' || v.attempts || ' of ' || v.max_attempts \
                        || ' attempts used (it should be dead)' \
                WHEN NOT EXISTS (SELECT 1 FROM shardq_map_moves m \
                    WHERE m.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e) \
                      AND m.first_key <= v.shard_key AND v.shard_key < m.end_key \
                      AND m.state <> 'released') \
                    THEN 'held outside any unfinished move (nothing releases it)' \
                END \
            ELSE CASE \
                WHEN v.owner IS NOT NULL THEN v.status || ' with an owner (' || v.owner || ')' \
                WHEN v.lease_expires_at IS NOT NULL THEN v.status || ' with a lease' \
                WHEN v.finished_at IS NULL \
                    THEN v.status || ' without finished_at (retention never deletes it)' \
                END \
            END AS rule \
        FROM visited v \
    ), broken AS MATERIALIZED ( \
        SELECT DISTINCT shard_key, id, queue, ordering_key, rule FROM judged \
        WHERE rule IS NOT NULL \
    ), shown AS ( \
        SELECT * FROM broken ORDER BY id LIMIT $2 \
    ) \
    SELECT (SELECT count(*) FROM broken) AS broken, \
        EXISTS (SELECT 1 FROM visited WHERE scan NOT IN ('running', 'finished', 'newest') \
            GROUP BY scan HAVING count(*) >= $1) AS capped, \
        (SELECT count(*) FROM visited) AS scanned, \
        coalesce(array_agg(shard_key ORDER BY id), '{}') AS ex_shard_key, \
        coalesce(array_agg(id ORDER BY id), '{}') AS ex_id, \
        coalesce(array_agg(queue ORDER BY id), '{}') AS ex_queue, \
        coalesce(array_agg(ordering_key ORDER BY id), '{}') AS ex_key, \
        coalesce(array_agg(rule ORDER BY id), '{}') AS ex_detail \
    FROM shown"
    };
}

/// The windows both job-state reads share, after `WITH visited AS
/// MATERIALIZED (`: every running row (from the lease floor, and those
/// without a lease), the first $1 ready jobs without a group from their
/// ready floors (plain and keyed, in the order the claims take them), the
/// $1 latest finished and the $1 newest jobs of any state.
macro_rules! job_state_windows {
    () => {
        concat!(
            "(SELECT 'running' AS scan, ",
            job_state_columns!(),
            " FROM workflow_status WHERE status = 'running' AND ",
            at_or_past_lease_floor!("lease_expires_at"),
            ") \
        UNION ALL \
        (SELECT 'running', ",
            job_state_columns!(),
            " FROM workflow_status WHERE status = 'running' AND lease_expires_at IS NULL) \
        UNION ALL \
        (SELECT 'queued', w.* FROM shardq_ready_floors f CROSS JOIN LATERAL ( \
            SELECT ",
            job_state_columns!(),
            " FROM workflow_status r \
            WHERE r.status = 'queued' AND r.ordering_key IS NULL AND r.job_group IS NULL \
              AND r.queue = f.queue AND r.priority = f.priority \
              AND r.ready_seq >= f.floor_seq \
            ORDER BY r.ready_seq LIMIT $1) w LIMIT $1) \
        UNION ALL \
        (SELECT 'queued_keyed', w.* FROM shardq_ready_floors f CROSS JOIN LATERAL ( \
            SELECT ",
            job_state_columns!(),
            " FROM workflow_status r \
            WHERE r.status = 'queued' AND r.ordering_key IS NOT NULL \
              AND r.queue = f.queue AND r.priority = f.priority \
              AND r.ready_seq >= f.keyed_floor_seq \
            ORDER BY r.ready_seq LIMIT $1) w LIMIT $1) \
        UNION ALL \
        (SELECT 'finished', ",
            job_state_columns!(),
            " FROM workflow_status WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled') \
         ORDER BY finished_at DESC LIMIT $1) \
        UNION ALL \
        (SELECT 'newest', ",
            job_state_columns!(),
            " FROM workflow_status ORDER BY id DESC LIMIT $1) "
        )
    };
}

/// Jobs whose columns disagree with their status. The legal combinations,
/// from every statement that writes a job (insert, claim, completion,
/// release, recovery, promotion, cancel, retry):
///
/// - `running`: an owner, a lease, a fence raised by its claim (≥ 1), a
///   `started_at`, no `finished_at`, attempts in 1..=max_attempts;
/// - `waiting`, `queued`, `scheduled`: no owner, no lease, no
///   `finished_at`, no cancellation asked (a cancel finishes them at once;
///   only a running job waits on one), attempts in 0..max_attempts (one
///   more would have made it dead); `waiting` only with an ordering key
///   (nothing queues an unkeyed waiting job); a `queued` job without a key
///   or group numbered at or past its queue and priority's ready floor,
///   and a grouped one with a turn at or past its queue's grouped floor
///   (claims start there: one below it, or unnumbered, is never claimed;
///   a grouped one without a turn is numbered by the next move of its
///   queue's rounds);
/// - finished (`succeeded`, `failed`, `dead`, `cancelled`): no owner, no
///   lease, a `finished_at` (retention deletes by it);
/// - `held` (a range move's copy, or a job marked for copying on its old
///   shard): what a move promises, not what a finished job does: a status
///   to return to (`running` only for a stand-in), no owner, no lease, no
///   `finished_at`, attempts left as for an unclaimed job, and a move of
///   its shard key that is not yet released (once released, nothing would
///   ever release it).
///
/// Rows read (cost ∝ what the fleet holds plus 9 × $1): every running row
/// (`workflow_status_lease` from the lease floor, and its entries without
/// a lease); the first $1 ready jobs without a group from their ready
/// floors, plain and keyed (`workflow_status_ready_plain` and
/// `_ready_keyed`, in the order the claims take them); the first $1 ready
/// jobs from each index's start (the dequeue order of the plain and keyed
/// dequeue indexes, grouped ones by their groups' lines: only there is a
/// ready job below its floor met); the first $1 `waiting` in key order and
/// `scheduled` soonest due first; the $1 latest finished
/// (`workflow_status_finished` backward: rows without `finished_at` come
/// first); and the $1 newest jobs of any state (the primary key backward:
/// the only way to meet an unkeyed waiting job, which no index holds).
/// Cost: about 2-4 µs per row read (25 ms with $1 = 2,000 and 5,000 running
/// on an idle server, 54-66 ms on this 2-core machine under load, before
/// the windows from the floors were added). While a long transaction
/// holds the horizon, the windows from each index's start walk the dead
/// entry of every job claimed since (about 0.35 µs each):
/// [`CHECK_JOB_STATE_FROM_FLOORS`] leaves them out.
/// `capped` says an unfinished state had more rows than $1. Examples ($2):
/// the lowest ids, with the first rule each breaks.
pub const CHECK_JOB_STATE: &str = concat!(
    "WITH visited AS MATERIALIZED ( ",
    job_state_windows!(),
    "UNION ALL \
        (SELECT 'waiting', ",
    job_state_columns!(),
    " FROM workflow_status WHERE status = 'waiting' AND ordering_key IS NOT NULL \
             AND hashtext(ordering_key) IS NOT NULL \
         ORDER BY queue, ordering_key, status, id LIMIT $1) \
        UNION ALL \
        (SELECT 'scheduled', ",
    job_state_columns!(),
    " FROM workflow_status WHERE status = 'scheduled' ORDER BY run_at LIMIT $1) \
        UNION ALL \
        (SELECT 'queued_from_start', ",
    job_state_columns!(),
    " FROM workflow_status WHERE status = 'queued' AND ordering_key IS NULL \
             AND job_group IS NULL \
         ORDER BY queue, priority, id LIMIT $1) \
        UNION ALL \
        (SELECT 'keyed_from_start', ",
    job_state_columns!(),
    " FROM workflow_status WHERE status = 'queued' AND ordering_key IS NOT NULL \
         ORDER BY queue, priority, id LIMIT $1) \
        UNION ALL \
        (SELECT 'queued_grouped', ",
    job_state_columns!(),
    " FROM workflow_status WHERE status >= 'queued' AND status <= 'queued' \
             AND job_group IS NOT NULL AND hashtext(job_group) IS NOT NULL \
         ORDER BY queue, hashtext(job_group), job_group, priority, turn, id LIMIT $1) ",
    judged_job_states!()
);

/// [`CHECK_JOB_STATE`] without its windows from each index's start (of
/// ready jobs, and of `waiting` and scheduled ones: while a long
/// transaction holds the horizon, these walk the dead entry of every job
/// that left the state since): what `store::check` reads when the full
/// read ran past its share of the check's deadline. Ready jobs below
/// their floor, grouped ready jobs, and `waiting` and scheduled jobs other
/// than the newest are not judged then.
pub const CHECK_JOB_STATE_FROM_FLOORS: &str = concat!(
    "WITH visited AS MATERIALIZED ( ",
    job_state_windows!(),
    judged_job_states!()
);
