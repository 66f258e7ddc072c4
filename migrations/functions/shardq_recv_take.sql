-- shardq_recv_take: a recv step's deciding statement, run after
-- shardq_hold_workflow in the same transaction (a statement of its own,
-- so its snapshot sees every message committed before the lock was
-- granted), only when the claim holds the workflow (p_shard_key, p_id):
-- recv step p_name of topic p_topic decides, once, and only by inserting
-- (a recorded step output is never changed). A step that decided before
-- is returned as it is. Otherwise the oldest unreceived message of the
-- topic (by `seq`, the shard's order) is taken (marked received by the
-- step) and recorded as the step's output (`message`, `seq`, `topic`);
-- with none, when the wait's deadline has passed, the step is recorded
-- `timed_out`; or not: the wait is recorded as step `p_name:wait`
-- (`topic`, `deadline`: the shard's clock plus p_micros µs, written by the
-- first call, kept by every later one) and the workflow's `run_at` set to
-- the deadline, so the `parked` outcome makes it ready then (or a send
-- wakes it sooner). Returns the step's output, or the wait's while it
-- waits.
--
-- Planned once per session (shardq_step_log says why).
CREATE OR REPLACE FUNCTION shardq_recv_take(p_shard_key int, p_id bigint, p_name text,
    p_topic text, p_micros bigint)
RETURNS TABLE (output jsonb, wait_recorded bigint, parked bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH recorded AS MATERIALIZED (
        SELECT s.output FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_name
    ), waited AS MATERIALIZED (
        SELECT s.output FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id
            AND s.step_name = p_name || ':wait'
    ), pending AS MATERIALIZED (
        SELECT coalesce((SELECT w.output FROM waited w), jsonb_build_object('topic', p_topic,
            'deadline', statement_timestamp() + p_micros * interval '1 microsecond')) AS wait
        WHERE NOT EXISTS (SELECT 1 FROM recorded)
    ), oldest AS MATERIALIZED (
        SELECT m.seq FROM workflow_messages m
        WHERE m.shard_key = p_shard_key AND m.workflow_id = p_id AND m.topic = p_topic
            AND m.received_by_step IS NULL AND EXISTS (SELECT 1 FROM pending)
        ORDER BY m.seq LIMIT 1
    ), taken AS MATERIALIZED (
        UPDATE workflow_messages m SET received_by_step = p_name FROM oldest o
        WHERE m.shard_key = p_shard_key AND m.workflow_id = p_id AND m.seq = o.seq
        RETURNING m.seq, m.message
    ), decided AS MATERIALIZED (
        SELECT CASE
            WHEN t.seq IS NOT NULL THEN
                jsonb_build_object('topic', p_topic, 'message', t.message, 'seq', t.seq)
            WHEN (p.wait->>'deadline')::timestamptz <= clock_timestamp() THEN
                jsonb_build_object('topic', p_topic, 'timed_out', true)
            END AS output, p.wait
        FROM pending p LEFT JOIN taken t ON true
    ), written AS MATERIALIZED (
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        SELECT p_shard_key, p_id, p_name, d.output FROM decided d WHERE d.output IS NOT NULL
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING
        RETURNING workflow_steps.output
    ), waiting AS MATERIALIZED (
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        SELECT p_shard_key, p_id, p_name || ':wait', d.wait FROM decided d
        WHERE d.output IS NULL AND NOT EXISTS (SELECT 1 FROM waited)
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING
        RETURNING workflow_steps.output
    ), park AS MATERIALIZED (
        UPDATE workflow_status w SET run_at = (d.wait->>'deadline')::timestamptz
        FROM decided d
        WHERE w.shard_key = p_shard_key AND w.id = p_id AND d.output IS NULL
        RETURNING 1
    )
    SELECT coalesce((SELECT r.output FROM recorded r), (SELECT x.output FROM written x),
            (SELECT d.wait FROM decided d)),
        (SELECT count(*) FROM waiting), (SELECT count(*) FROM park);
END $$;
