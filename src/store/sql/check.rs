//! `shardq check`: reads that find broken invariants on one shard.
//!
//! All run in one `REPEATABLE READ READ ONLY` transaction ([`CHECK_SETTINGS`]
//! first), so they judge one snapshot, and `now()` is that snapshot's time.
//! Each walks a partial index that holds no finished row, or a window of at
//! most a bound number of rows, never the history: the cost of every
//! statement is stated beside it (measured on PostgreSQL 15 with 2,000,000
//! finished, 200,000 queued, 100,000 keyed and 5,000 running rows).
//!
//! Every statement returns one row of the same shape: `broken` (how many
//! found), `capped` (the scan stopped at its bound: there may be more),
//! `scanned` (rows or index entries read), and up to $examples examples as
//! parallel arrays `ex_shard_key`, `ex_id`, `ex_queue`, `ex_key`,
//! `ex_detail`.

/// Settings for this transaction only (nothing stays on the session, which
/// a pooler may lend on): the client's deadline ($1, ms, as text), so a
/// check cut off stops working on the server too; and the plans that keep
/// every read bounded. Each window is an index walk that its `LIMIT` stops:
/// with bitmap scans allowed, the planner read all 40,000 waiting rows and
/// sorted them to keep 2,000 (446 ms instead of 72 for the job states on
/// the shard measured above). Seq scans and JIT are off as on shardq's own
/// connections, which a transaction pooler does not give (no connect-time
/// options behind one).
pub const CHECK_SETTINGS: &str = "SELECT set_config('statement_timeout', $1::text, true), \
    set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true), \
    set_config('jit', 'off', true)";

/// Keys stranded: a (queue, ordering key) with `waiting` jobs and no
/// queued, running or scheduled job, so nothing ever queues them again.
///
/// One pass over the first $1 entries of `workflow_status_key` (queue,
/// ordering_key, status, id) in index order, index only, grouped per key as
/// it goes (no sort, nothing kept but the running group). A key's entries
/// sort `queued` < `running` < `scheduled` < `waiting`, so a key cut by the
/// bound shows its active jobs before its waiting ones: a cut never makes
/// a key look stranded. Cost: linear in keyed unfinished jobs up to $1
/// (about 2 µs per entry: 200 ms for 100,000 on this 2-core machine, most of it when many keys are stranded), never in history. Examples
/// ($2): each stranded key's lowest waiting job (one primary-key probe
/// each, for its shard key), and its count of waiting jobs.
pub const CHECK_STRANDED_KEYS: &str = "WITH groups AS ( \
        SELECT e.queue, e.ordering_key, count(*) AS entries, min(e.id) AS first_id, \
            bool_and(e.status = 'waiting') AS stranded \
        FROM (SELECT w.queue, w.ordering_key, w.status, w.id FROM workflow_status w \
            WHERE w.ordering_key IS NOT NULL AND hashtext(w.ordering_key) IS NOT NULL \
              AND w.status IN ('waiting', 'queued', 'running', 'scheduled') \
            ORDER BY w.queue, w.ordering_key, w.status, w.id LIMIT $1) e \
        GROUP BY e.queue, e.ordering_key \
    ), totals AS ( \
        SELECT count(*) FILTER (WHERE stranded) AS broken, \
            coalesce(sum(entries), 0)::bigint AS scanned, \
            (array_agg(first_id ORDER BY first_id) FILTER (WHERE stranded))[1:$2] AS ids, \
            (array_agg(entries ORDER BY first_id) FILTER (WHERE stranded))[1:$2] AS waiting \
        FROM groups \
    ) \
    SELECT t.broken, t.scanned >= $1 AS capped, t.scanned, \
        coalesce(array_agg(e.shard_key ORDER BY e.n) FILTER (WHERE e.id IS NOT NULL), '{}') \
            AS ex_shard_key, \
        coalesce(array_agg(e.id ORDER BY e.n) FILTER (WHERE e.id IS NOT NULL), '{}') AS ex_id, \
        coalesce(array_agg(e.queue ORDER BY e.n) FILTER (WHERE e.id IS NOT NULL), '{}') \
            AS ex_queue, \
        coalesce(array_agg(e.ordering_key ORDER BY e.n) FILTER (WHERE e.id IS NOT NULL), '{}') \
            AS ex_key, \
        coalesce(array_agg(e.waiting || ' waiting job(s), none queued, running or scheduled' \
            ORDER BY e.n) FILTER (WHERE e.id IS NOT NULL), '{}') AS ex_detail \
    FROM totals t \
    LEFT JOIN LATERAL ( \
        SELECT x.n, x.waiting, w.shard_key, w.id, w.queue, w.ordering_key \
        FROM unnest(t.ids, t.waiting) WITH ORDINALITY AS x(id, waiting, n) \
        JOIN workflow_status w ON w.id = x.id) e ON true \
    GROUP BY t.broken, t.scanned";

/// Keys running twice: a (queue, ordering key) whose running jobs came
/// from more than one claim. A claim takes a free key's jobs as one run
/// (all `running`, one owner, one `started_at`: the claim's transaction
/// time), and no claim takes a key that has a running job, so two owners
/// or two claim times mean two claims ran one key at once.
///
/// Walks every running row (`workflow_status_lease`, from the lease
/// floor), which is what the fleet holds, not the backlog or history;
/// sorts the keyed ones by key.
/// Cost: about 2 µs per running row (9 ms for 5,000). Examples ($1): each
/// key's lowest running job.
pub const CHECK_KEY_RUNNING_TWICE: &str = concat!(
    "WITH keys AS MATERIALIZED ( \
        SELECT w.queue, w.ordering_key, count(*) AS running, \
            count(DISTINCT w.owner) AS owners, count(DISTINCT w.started_at) AS claims, \
            (array_agg(w.shard_key ORDER BY w.id))[1] AS shard_key, min(w.id) AS id, \
            string_agg(DISTINCT w.owner, ', ') AS owner_list \
        FROM workflow_status w \
        WHERE w.status = 'running' AND w.ordering_key IS NOT NULL AND ",
    at_or_past_lease_floor!("w.lease_expires_at"),
    " \
        GROUP BY w.queue, w.ordering_key \
    ), broken AS MATERIALIZED ( \
        SELECT * FROM keys WHERE owners > 1 OR claims > 1 \
    ), shown AS ( \
        SELECT * FROM broken ORDER BY id LIMIT $1 \
    ) \
    SELECT (SELECT count(*) FROM broken) AS broken, false AS capped, \
        (SELECT coalesce(sum(running), 0)::bigint FROM keys) AS scanned, \
        coalesce(array_agg(shard_key ORDER BY id), '{}') AS ex_shard_key, \
        coalesce(array_agg(id ORDER BY id), '{}') AS ex_id, \
        coalesce(array_agg(queue ORDER BY id), '{}') AS ex_queue, \
        coalesce(array_agg(ordering_key ORDER BY id), '{}') AS ex_key, \
        coalesce(array_agg(running || ' running jobs from ' || claims || ' claim time(s) by ' \
            || owners || ' owner(s): ' || coalesce(owner_list, 'none') ORDER BY id), '{}') \
            AS ex_detail \
    FROM shown"
);

/// Recovery not happening: running jobs whose lease expired more than $1
/// ms ago. At most $2 counted, oldest first.
///
/// A range of `workflow_status_lease` (lease_expires_at) below the
/// threshold: index entries of expired leases only, at most $2. Cost: well
/// under 1 ms when recovery keeps up. Examples ($3): the oldest.
pub const CHECK_LEASE_NOT_RECOVERED: &str = concat!(
    "WITH found AS MATERIALIZED ( \
        SELECT w.shard_key, w.id, w.queue, w.ordering_key, w.owner, w.lease_expires_at \
        FROM workflow_status w \
        WHERE w.status = 'running' AND ",
    at_or_past_lease_floor!("w.lease_expires_at"),
    " \
          AND w.lease_expires_at < now() - $1::bigint * interval '1 millisecond' \
        ORDER BY w.lease_expires_at LIMIT $2 \
    ), shown AS ( \
        SELECT * FROM found ORDER BY lease_expires_at LIMIT $3 \
    ) \
    SELECT (SELECT count(*) FROM found) AS broken, \
        (SELECT count(*) FROM found) >= $2 AS capped, \
        (SELECT count(*) FROM found) AS scanned, \
        coalesce(array_agg(shard_key ORDER BY lease_expires_at), '{}') AS ex_shard_key, \
        coalesce(array_agg(id ORDER BY lease_expires_at), '{}') AS ex_id, \
        coalesce(array_agg(queue ORDER BY lease_expires_at), '{}') AS ex_queue, \
        coalesce(array_agg(ordering_key ORDER BY lease_expires_at), '{}') AS ex_key, \
        coalesce(array_agg('lease expired ' \
            || round(extract(epoch FROM now() - lease_expires_at)::numeric, 1) \
            || ' s ago; owner ' || coalesce(owner, 'none') ORDER BY lease_expires_at), '{}') \
            AS ex_detail \
    FROM shown"
);

/// Promotion not happening: scheduled jobs due more than $1 ms ago. At
/// most $2 counted, oldest first.
///
/// A range of `workflow_status_scheduled` (run_at) below the threshold,
/// at most $2 entries. Cost: well under 1 ms when promotion keeps up.
/// Examples ($3): the longest overdue.
pub const CHECK_DUE_NOT_PROMOTED: &str = "WITH found AS MATERIALIZED ( \
        SELECT w.shard_key, w.id, w.queue, w.ordering_key, w.run_at \
        FROM workflow_status w \
        WHERE w.status = 'scheduled' \
          AND w.run_at < now() - $1::bigint * interval '1 millisecond' \
        ORDER BY w.run_at LIMIT $2 \
    ), shown AS ( \
        SELECT * FROM found ORDER BY run_at LIMIT $3 \
    ) \
    SELECT (SELECT count(*) FROM found) AS broken, \
        (SELECT count(*) FROM found) >= $2 AS capped, \
        (SELECT count(*) FROM found) AS scanned, \
        coalesce(array_agg(shard_key ORDER BY run_at), '{}') AS ex_shard_key, \
        coalesce(array_agg(id ORDER BY run_at), '{}') AS ex_id, \
        coalesce(array_agg(queue ORDER BY run_at), '{}') AS ex_queue, \
        coalesce(array_agg(ordering_key ORDER BY run_at), '{}') AS ex_key, \
        coalesce(array_agg('due ' || round(extract(epoch FROM now() - run_at)::numeric, 1) \
            || ' s ago, still scheduled' ORDER BY run_at), '{}') AS ex_detail \
    FROM shown";

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
/// Rows read (cost ∝ what the fleet holds plus 7 × $1): every running row
/// (`workflow_status_lease` from the lease floor, and its entries without
/// a lease); the first $1 of each unfinished state by its
/// own index (the dequeue order of the plain and keyed dequeue indexes,
/// grouped ones by their groups' lines, `waiting` in key order, `scheduled`
/// soonest due first); the $1 latest finished
/// (`workflow_status_finished` backward: rows without `finished_at` come
/// first); and the $1 newest jobs of any state (the primary key backward:
/// the only way to meet an unkeyed waiting job, which no index holds).
/// Cost: about 2-4 µs per row read (25 ms with $1 = 2,000 and 5,000 running
/// on an idle server, 54-66 ms on this 2-core machine under load).
/// `capped` says an unfinished state had more rows than $1. Examples ($2):
/// the lowest ids, with the first rule each breaks.
pub const CHECK_JOB_STATE: &str = concat!(
    "WITH visited AS MATERIALIZED ( \
        (SELECT 'running' AS scan, shard_key, id, queue, ordering_key, status, owner, \
            lease_expires_at, fence, attempts, max_attempts, started_at, finished_at, \
            cancel_requested, held_status, priority, job_group, ready_seq, turn \
         FROM workflow_status WHERE status = 'running' AND ",
    at_or_past_lease_floor!("lease_expires_at"),
    ") \
        UNION ALL \
        (SELECT 'running', shard_key, id, queue, ordering_key, status, owner, \
            lease_expires_at, fence, attempts, max_attempts, started_at, finished_at, \
            cancel_requested, held_status, priority, job_group, ready_seq, turn \
         FROM workflow_status WHERE status = 'running' AND lease_expires_at IS NULL) \
        UNION ALL \
        (SELECT 'queued', shard_key, id, queue, ordering_key, status, owner, \
            lease_expires_at, fence, attempts, max_attempts, started_at, finished_at, \
            cancel_requested, held_status, priority, job_group, ready_seq, turn \
         FROM workflow_status WHERE status = 'queued' AND ordering_key IS NULL \
             AND job_group IS NULL \
         ORDER BY queue, priority, id LIMIT $1) \
        UNION ALL \
        (SELECT 'queued_keyed', shard_key, id, queue, ordering_key, status, owner, \
            lease_expires_at, fence, attempts, max_attempts, started_at, finished_at, \
            cancel_requested, held_status, priority, job_group, ready_seq, turn \
         FROM workflow_status WHERE status = 'queued' AND ordering_key IS NOT NULL \
         ORDER BY queue, priority, id LIMIT $1) \
        UNION ALL \
        (SELECT 'queued_grouped', shard_key, id, queue, ordering_key, status, owner, \
            lease_expires_at, fence, attempts, max_attempts, started_at, finished_at, \
            cancel_requested, held_status, priority, job_group, ready_seq, turn \
         FROM workflow_status WHERE status >= 'queued' AND status <= 'queued' AND job_group IS NOT NULL \
             AND hashtext(job_group) IS NOT NULL \
         ORDER BY queue, hashtext(job_group), job_group, priority, turn, id LIMIT $1) \
        UNION ALL \
        (SELECT 'waiting', shard_key, id, queue, ordering_key, status, owner, \
            lease_expires_at, fence, attempts, max_attempts, started_at, finished_at, \
            cancel_requested, held_status, priority, job_group, ready_seq, turn \
         FROM workflow_status WHERE status = 'waiting' AND ordering_key IS NOT NULL \
             AND hashtext(ordering_key) IS NOT NULL \
         ORDER BY queue, ordering_key, status, id LIMIT $1) \
        UNION ALL \
        (SELECT 'scheduled', shard_key, id, queue, ordering_key, status, owner, \
            lease_expires_at, fence, attempts, max_attempts, started_at, finished_at, \
            cancel_requested, held_status, priority, job_group, ready_seq, turn \
         FROM workflow_status WHERE status = 'scheduled' ORDER BY run_at LIMIT $1) \
        UNION ALL \
        (SELECT 'finished', shard_key, id, queue, ordering_key, status, owner, \
            lease_expires_at, fence, attempts, max_attempts, started_at, finished_at, \
            cancel_requested, held_status, priority, job_group, ready_seq, turn \
         FROM workflow_status WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled') \
         ORDER BY finished_at DESC LIMIT $1) \
        UNION ALL \
        (SELECT 'newest', shard_key, id, queue, ordering_key, status, owner, \
            lease_expires_at, fence, attempts, max_attempts, started_at, finished_at, \
            cancel_requested, held_status, priority, job_group, ready_seq, turn \
         FROM workflow_status ORDER BY id DESC LIMIT $1) \
    ), judged AS ( \
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
);
