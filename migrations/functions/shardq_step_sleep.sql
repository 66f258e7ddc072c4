-- shardq_step_sleep: a durable sleep (step p_name) of workflow
-- (p_shard_key, p_id): its wake time, recorded by the first call as the
-- shard's `now()` plus p_micros µs, or p_until when given, and read back
-- by every later one; whether the shard's clock has passed it; and
-- whether the claim (p_owner, p_fence) still holds the workflow. While it
-- is not due, the workflow's `run_at` is set to it, so a `parked` outcome
-- makes the job ready then (shardq_complete_many).
--
-- A due sleep read back (the replay after the wake, the common call) is
-- a read: no row lock, no write, no transaction id. Its ownership and
-- cancellation are read from the statement's snapshot; a recovery or a
-- cancellation that commits after it is caught by the workflow's next
-- fenced write, as for a step returned from the log (shardq_step_log).
--
-- Otherwise the workflow's row is locked first (the recorded step is read
-- in the statement's one snapshot): a recovery or a cancellation cannot
-- commit between the fence check and the writes; one that committed
-- before is seen (not owned: nothing is written).
--
-- One statement, planned once per session (shardq_step_log says why).
CREATE OR REPLACE FUNCTION shardq_step_sleep(p_shard_key int, p_id bigint, p_name text,
    p_owner text, p_fence bigint, p_micros bigint, p_until timestamptz)
RETURNS TABLE (wake_at timestamptz, due boolean, owned boolean, parked bigint, cancelled boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH recorded AS MATERIALIZED (
        SELECT (s.output->>'wake_at')::timestamptz AS wake_at FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_name
    ), replay AS MATERIALIZED (
        SELECT 1 FROM recorded r WHERE r.wake_at <= clock_timestamp()
    ), seen AS MATERIALIZED (
        SELECT w.owner IS NOT DISTINCT FROM p_owner AND w.fence = p_fence
                AND w.status = 'running' AS held,
            w.cancel_requested FROM workflow_status w
        WHERE w.shard_key = p_shard_key AND w.id = p_id
    ), lock AS MATERIALIZED (
        SELECT 1 FROM workflow_status w
        WHERE w.shard_key = p_shard_key AND w.id = p_id
            AND w.owner = p_owner AND w.fence = p_fence AND NOT w.cancel_requested
            AND NOT EXISTS (SELECT 1 FROM replay)
        FOR UPDATE
    ), inserted AS MATERIALIZED (
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        SELECT p_shard_key, p_id, p_name, jsonb_build_object('wake_at',
            coalesce(p_until, now() + p_micros * interval '1 microsecond'))
        WHERE EXISTS (SELECT 1 FROM lock) AND NOT EXISTS (SELECT 1 FROM recorded)
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING
        RETURNING (workflow_steps.output->>'wake_at')::timestamptz AS wake_at
    ), wake AS MATERIALIZED (
        SELECT r.wake_at FROM recorded r UNION ALL SELECT i.wake_at FROM inserted i
    ), park AS (
        UPDATE workflow_status w SET run_at = wake.wake_at FROM wake
        WHERE w.shard_key = p_shard_key AND w.id = p_id AND EXISTS (SELECT 1 FROM lock)
            AND wake.wake_at > clock_timestamp()
        RETURNING 1
    )
    SELECT wake.wake_at, coalesce(wake.wake_at <= clock_timestamp(), false),
        EXISTS (SELECT 1 FROM lock)
            OR (EXISTS (SELECT 1 FROM replay)
                AND coalesce((SELECT s.held AND NOT s.cancel_requested FROM seen s), false)),
        (SELECT count(*) FROM park),
        coalesce((SELECT s.cancel_requested FROM seen s), false)
    FROM (SELECT 1) AS one LEFT JOIN wake ON true;
END $$;
