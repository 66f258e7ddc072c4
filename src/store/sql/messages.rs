//! Messages to a workflow: its mailbox (`workflow_messages`), the sends
//! that fill it and the recv steps that take from it.
//!
//! A send and a recv of one workflow are decided under its row's lock: a
//! send holds `FOR NO KEY UPDATE` (which also orders two sends), a recv
//! `FOR UPDATE`; each decides in a statement after the one that took the
//! lock (the send's two are in `shardq_send_row`, which SQL callers reach
//! through `shardq_send`), whose snapshot sees every commit made before the lock was granted.
//! So a message that committed before a recv got the lock is seen by it,
//! and a recv that decided first (a timeout) committed before the send
//! looked for a waiting recv. No writer can change what either decides
//! between its two statements: every writer of messages takes the lock, and
//! the recv's wait record is written under it.

/// A send (migrations/functions/shardq_send_row.sql, which says how it
/// is ordered with a recv, and which writers can run between its two
/// statements: none that changes what it decides): locks the recipient's
/// row (`FOR NO KEY UPDATE`), then, in a later statement, writes the
/// message and wakes the workflow when one of its recv steps waits on the
/// topic. Its params: $1 shard key, $2 id, $3 topic, $4 message, $5
/// idempotency key or NULL. Returns the workflow's `status` (NULL: none
/// here), whether the message was `written` and whether the workflow was
/// `woken`.
pub const MESSAGE_SEND: &str =
    "SELECT status, written, woken FROM shardq_send_row($1, $2, $3, $4, $5)";

/// A recv's first statement: locks the workflow's row (`FOR UPDATE`:
/// conflicts with a send's lock, a completion, a recovery, a
/// cancellation) and says whether this claim ($3 owner, $4 fence) still
/// holds it and whether its cancellation was asked. Its params: $1 shard
/// key, $2 id. Between it and [`MESSAGE_RECV_TAKE`], no writer changes
/// what that decides: a send, a step record, a recovery, a cancellation and
/// the job's deletion all need a lock that conflicts with this one.
pub const MESSAGE_RECV_LOCK: &str = "SELECT owner IS NOT DISTINCT FROM $3 AND fence = $4 \
        AND status = 'running' AS owned, cancel_requested \
    FROM workflow_status WHERE shard_key = $1 AND id = $2 FOR UPDATE";

/// A recv's second statement, under [`MESSAGE_RECV_LOCK`] (a new snapshot:
/// it sees every message committed before the lock was granted), run only
/// when the claim holds the workflow: recv step $3 of topic $4 decides,
/// once, and only by inserting (a recorded step output is never changed).
/// A step that decided before (recorded under its name $3) is returned as
/// it is. Otherwise the oldest unreceived message of the topic (by `seq`,
/// the shard's order) is taken (marked received by the step) and recorded
/// as the step's output (`message`, `seq`, `topic`); with none, when the
/// wait's deadline has passed, the step is recorded `timed_out`; or not:
/// the wait is recorded as step `$3:wait` (`topic`, `deadline`: the
/// shard's clock plus $5 µs, written by the first call, kept by every
/// later one) and the workflow's `run_at` set to the deadline, so the
/// `parked` outcome makes it ready then (or a send wakes it sooner).
/// Returns the step's output, or the wait's while it waits.
pub const MESSAGE_RECV_TAKE: &str = "WITH recorded AS MATERIALIZED ( \
        SELECT output FROM workflow_steps \
        WHERE shard_key = $1 AND workflow_id = $2 AND step_name = $3 \
    ), waited AS MATERIALIZED ( \
        SELECT output FROM workflow_steps \
        WHERE shard_key = $1 AND workflow_id = $2 AND step_name = $3 || ':wait' \
    ), pending AS MATERIALIZED ( \
        SELECT coalesce((SELECT output FROM waited), jsonb_build_object('topic', $4::text, \
            'deadline', statement_timestamp() + $5::bigint * interval '1 microsecond')) AS wait \
        WHERE NOT EXISTS (SELECT 1 FROM recorded) \
    ), oldest AS MATERIALIZED ( \
        SELECT m.seq FROM workflow_messages m \
        WHERE m.shard_key = $1 AND m.workflow_id = $2 AND m.topic = $4 \
            AND m.received_by_step IS NULL AND EXISTS (SELECT 1 FROM pending) \
        ORDER BY m.seq LIMIT 1 \
    ), taken AS MATERIALIZED ( \
        UPDATE workflow_messages m SET received_by_step = $3 FROM oldest \
        WHERE m.shard_key = $1 AND m.workflow_id = $2 AND m.seq = oldest.seq \
        RETURNING m.seq, m.message \
    ), decided AS MATERIALIZED ( \
        SELECT CASE \
            WHEN t.seq IS NOT NULL THEN \
                jsonb_build_object('topic', $4::text, 'message', t.message, 'seq', t.seq) \
            WHEN (p.wait->>'deadline')::timestamptz <= clock_timestamp() THEN \
                jsonb_build_object('topic', $4::text, 'timed_out', true) \
            END AS output, p.wait \
        FROM pending p LEFT JOIN taken t ON true \
    ), written AS MATERIALIZED ( \
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output) \
        SELECT $1, $2, $3, output FROM decided WHERE output IS NOT NULL \
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING \
        RETURNING output \
    ), waiting AS MATERIALIZED ( \
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output) \
        SELECT $1, $2, $3 || ':wait', wait FROM decided \
        WHERE output IS NULL AND NOT EXISTS (SELECT 1 FROM waited) \
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING \
        RETURNING output \
    ), parked AS MATERIALIZED ( \
        UPDATE workflow_status w SET run_at = (d.wait->>'deadline')::timestamptz \
        FROM decided d \
        WHERE w.shard_key = $1 AND w.id = $2 AND d.output IS NULL \
        RETURNING 1 \
    ) \
    SELECT coalesce((SELECT output FROM recorded), (SELECT output FROM written), \
            (SELECT wait FROM decided)) AS output, \
        (SELECT count(*) FROM waiting) AS wait_recorded, (SELECT count(*) FROM parked) AS parked";
