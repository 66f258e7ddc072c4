//! Messages to a workflow: its mailbox (`workflow_messages`), the sends
//! that fill it and the recv steps that take from it.
//!
//! A send and a recv of one workflow are decided under its row's lock: a
//! send holds `FOR NO KEY UPDATE` (which also orders two sends), a recv
//! `FOR UPDATE`; each decides in a statement after the one that took the
//! lock, whose snapshot sees every commit made before the lock was granted.
//! So a message that committed before a recv got the lock is seen by it,
//! and a recv that decided first (a timeout) committed before the send
//! looked for a waiting recv. No writer can change what either decides
//! between its two statements: every writer of messages takes the lock, and
//! the recv's wait record is written under it.

/// A send's first statement: locks the recipient's row (`FOR NO KEY
/// UPDATE`: conflicts with a recv's `FOR UPDATE` and another send's lock,
/// not with the foreign key checks of the workflow's steps) and returns
/// its status. A held stand-in (`held_status = 'running'`, the copy of a
/// job running on the shard its range moves from) is not the workflow: no
/// row. Its params: $1 shard key, $2 id. Between it and
/// [`MESSAGE_SEND_WRITE`], no writer changes what that decides: a recv
/// (its take, its wait), another send, a completion, a cancellation, a
/// move's mark and the job's deletion all need a lock that conflicts with
/// this one; only other workflows' rows change meanwhile.
pub const MESSAGE_SEND_LOCK: &str = "SELECT status FROM workflow_status \
    WHERE shard_key = $1 AND id = $2 AND NOT (status = 'held' AND held_status = 'running') \
    FOR NO KEY UPDATE";

/// A send's second statement, under [`MESSAGE_SEND_LOCK`] (a new snapshot:
/// it sees a recv that decided before the lock was granted): when the
/// workflow has not finished nor is moving, writes the message ($3 topic,
/// $4 message, $5 idempotency key or NULL; a key used before for this
/// workflow writes nothing) and wakes the workflow when one of its recv
/// steps waits on the topic: `run_at` is now, and a parked (`scheduled`)
/// workflow is queued at once, as the promotion of due jobs would
/// (`JOB_PROMOTE_DUE`, which says why): one without an ordering key
/// freely, a keyed one when the try of its key's lock succeeds (it never
/// waits, so it cannot deadlock with the row lock held); one whose key a
/// claim holds now is left due, for that promotion, within the maintenance
/// interval. A running one (its recv has not parked it yet) is parked due
/// and promoted the same way. Idle workers are notified of a job queued.
/// Returns whether the message was written and whether the workflow was
/// woken.
pub const MESSAGE_SEND_WRITE: &str = "WITH open AS MATERIALIZED ( \
        SELECT w.status, w.queue, w.ordering_key, w.cancel_requested FROM workflow_status w \
        WHERE w.shard_key = $1 AND w.id = $2 \
            AND w.status IN ('waiting', 'scheduled', 'queued', 'running') \
    ), inserted AS MATERIALIZED ( \
        INSERT INTO workflow_messages (shard_key, workflow_id, topic, message, idempotency_key) \
        SELECT $1, $2, $3, $4, $5 FROM open \
        ON CONFLICT (shard_key, workflow_id, idempotency_key) \
            WHERE idempotency_key IS NOT NULL DO NOTHING \
        RETURNING seq \
    ), waiting AS MATERIALIZED ( \
        SELECT 1 FROM workflow_steps s \
        WHERE s.shard_key = $1 AND s.workflow_id = $2 AND s.step_name LIKE 'shardq:recv:%:wait' \
            AND s.output->>'topic' = $3 AND EXISTS (SELECT 1 FROM inserted) \
            AND NOT EXISTS (SELECT 1 FROM workflow_steps d \
                WHERE d.shard_key = $1 AND d.workflow_id = $2 \
                    AND d.step_name = left(s.step_name, -length(':wait'))) \
        LIMIT 1 \
    ), woken AS MATERIALIZED ( \
        UPDATE workflow_status w SET run_at = now(), \
            status = CASE WHEN w.status = 'scheduled' AND (w.ordering_key IS NULL \
                    OR pg_try_advisory_xact_lock(shardq_key_lock(w.queue, w.ordering_key))) \
                THEN 'queued' ELSE w.status END \
        WHERE w.shard_key = $1 AND w.id = $2 AND EXISTS (SELECT 1 FROM waiting) \
            AND w.status IN ('scheduled', 'running') AND NOT w.cancel_requested \
        RETURNING w.status, w.queue \
    ), notified AS MATERIALIZED ( \
        SELECT pg_notify('shardq_ready', queue) FROM woken WHERE status = 'queued' \
    ) \
    SELECT EXISTS (SELECT 1 FROM inserted) AS written, \
        EXISTS (SELECT 1 FROM woken) AS woken, (SELECT count(*) FROM notified) AS notified";

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
