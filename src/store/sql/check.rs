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
