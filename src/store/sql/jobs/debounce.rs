//! Enqueueing debounced jobs (`NewJob::debounce`, migrations/0034_debounce.sql).

/// Writes debounced jobs, at most one per (queue, debounce key) in one
/// statement (ON CONFLICT DO UPDATE cannot change a row twice in one
/// statement: the caller keeps the last of a batch's duplicates). Each job
/// either joins its key's pending run (the row in `workflow_status_debounce`:
/// `scheduled`, or `held` by a move), which then carries this job's
/// payload, handler, priority and attempt limit and starts $7 ms after this
/// enqueue but never after the run's `debounce_until` and never earlier
/// than it was set to start; or, when the key has no pending run, is a new
/// `scheduled` row under its reserved id ($1), starting $7 ms from now,
/// `debounce_until` $8 ms from now. A job whose reserved id exists already
/// is skipped: an earlier try of this call wrote it (its reply lost).
/// Fenced by the epoch ($9) as `JOB_INSERT_MANY_AS`. $10: attempt limits,
/// $11: debounce keys, $12: timeouts in ms (NULL: none; a joined run takes
/// the last enqueue's deadline, as it takes its payload). Returns, per job written or joined, its queue, key
/// and the pending run's id.
///
/// Concurrent writers of the pending row, and what the upsert does:
/// another enqueue of the key (its uncommitted insert or update makes this
/// statement wait, then join the row it left: the one to commit last
/// writes last, so the payload is the last committed); the promotion
/// queueing it (`JOB_PROMOTE_DUE`, which clears `debounce_until`): waited
/// for, then the row is out of the index and this enqueue inserts the
/// key's next run; were the promotion rolled back, the row is joined. A
/// cancel turns it `cancelled` (out of the index the same way).
pub const JOB_INSERT_DEBOUNCED: &str = "WITH fence AS MATERIALIZED ( \
        SELECT shardq_check_route($9::int, VARIADIC $2::int[]) AS ok) \
    INSERT INTO workflow_status AS w \
    (id, shard_key, queue, handler, priority, payload, status, run_at, max_attempts, \
     debounce_key, debounce_until, deadline_at) \
    OVERRIDING SYSTEM VALUE \
    SELECT t.id, t.shard_key, t.queue, t.handler, t.priority, t.payload, 'scheduled', \
        now() + t.period_ms * interval '1 millisecond', t.max_attempts, t.debounce_key, \
        now() + t.max_wait_ms * interval '1 millisecond', \
        now() + t.timeout_ms * interval '1 millisecond' \
    FROM fence, unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::int[], \
                $6::jsonb[], $7::bigint[], $8::bigint[], $10::int[], $11::text[], \
                $12::bigint[]) \
        WITH ORDINALITY AS t(id, shard_key, queue, handler, priority, payload, period_ms, \
                             max_wait_ms, max_attempts, debounce_key, timeout_ms, ord) \
    WHERE fence.ok AND NOT EXISTS (SELECT 1 FROM workflow_status e \
        WHERE e.id = t.id AND e.shard_key = t.shard_key) \
    ORDER BY t.ord \
    ON CONFLICT (queue, debounce_key) \
        WHERE debounce_until IS NOT NULL AND status IN ('scheduled', 'held') \
          AND NOT cancel_requested \
    DO UPDATE SET payload = excluded.payload, handler = excluded.handler, \
        priority = excluded.priority, max_attempts = excluded.max_attempts, \
        deadline_at = excluded.deadline_at, \
        run_at = least(greatest(w.run_at, excluded.run_at), w.debounce_until) \
    RETURNING w.queue, w.debounce_key, w.id";
