-- shardq_step_record: records step p_name's output p_output of workflow
-- (p_shard_key, p_id), fenced: only while the workflow is still running
-- under owner p_owner and claim fence p_fence and not being cancelled.
-- The fence is read with a row lock, so it is the row's latest version
-- (not the statement's snapshot) and a recovery cannot commit between the
-- check and the insert. True when recorded (now or before).
--
-- A step this attempt recorded before (the reply was lost and the record
-- is sent again) is also true, and keeps its first output.
--
-- One statement, planned once per session (shardq_step_log says why).
CREATE OR REPLACE FUNCTION shardq_step_record(p_shard_key int, p_id bigint, p_name text,
    p_output jsonb, p_owner text, p_fence bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    recorded boolean;
BEGIN
    WITH owned AS MATERIALIZED (
        SELECT 1 FROM workflow_status
        WHERE shard_key = p_shard_key AND id = p_id
            AND owner = p_owner AND fence = p_fence AND NOT cancel_requested
        FOR SHARE
    ), inserted AS (
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        SELECT p_shard_key, p_id, p_name, p_output WHERE EXISTS (SELECT 1 FROM owned)
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM inserted)
        OR EXISTS (SELECT 1 FROM workflow_steps
                   WHERE shard_key = p_shard_key AND workflow_id = p_id AND step_name = p_name
                     AND EXISTS (SELECT 1 FROM owned))
    INTO recorded;
    RETURN recorded;
END $$;
