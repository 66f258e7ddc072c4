-- shardq_child_result_decide: a child's result step's deciding statement,
-- run after shardq_hold_workflow on the parent in the same transaction (a
-- statement of its own, so its snapshot sees a child whose final status
-- committed before the lock was granted): result step p_name of the
-- parent (p_shard_key, p_id) on child (p_child_shard_key, p_child_id)
-- decides once, only by inserting. A step recorded before is returned as
-- it is. A child that finished (succeeded, failed, dead, cancelled) is
-- recorded as the step's output (`status`, `output`, `error`). Otherwise
-- the wait is recorded as step `p_name:wait` (`child_id`: what the
-- child's wake looks for) and the parent's `run_at` set p_recheck_ms
-- ahead, so its `parked` outcome parks it until the child's completion
-- wakes it (or then, a re-check that costs one replay). Returns the
-- step's output (NULL while it waits), whether the child exists, and the
-- re-check time.
--
-- Between the lock and this statement no writer changes what this
-- decides but the child's final write, which, committed before this
-- statement, is seen here, and committed after, finds the wait recorded
-- when its try of the parent's lock succeeds, or flags the child for the
-- promotion when it does not (the lock is held until this transaction
-- commits).
--
-- Planned once per session (shardq_step_log says why).
CREATE OR REPLACE FUNCTION shardq_child_result_decide(p_shard_key int, p_id bigint,
    p_name text, p_child_shard_key int, p_child_id bigint, p_recheck_ms bigint)
RETURNS TABLE (output jsonb, found boolean, until timestamptz, wait_recorded bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH recorded AS MATERIALIZED (
        SELECT s.output FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_name
    ), child AS MATERIALIZED (
        SELECT c.status, c.output, c.error FROM workflow_status c
        WHERE c.shard_key = p_child_shard_key AND c.id = p_child_id
            AND NOT EXISTS (SELECT 1 FROM recorded)
            AND NOT (c.status = 'held' AND c.held_status = 'running')
    ), finished AS MATERIALIZED (
        SELECT jsonb_build_object('status', c.status, 'output', c.output, 'error', c.error)
            AS output
        FROM child c WHERE c.status IN ('succeeded', 'failed', 'dead', 'cancelled')
    ), written AS MATERIALIZED (
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        SELECT p_shard_key, p_id, p_name, f.output FROM finished f
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING
        RETURNING workflow_steps.output
    ), waiting AS MATERIALIZED (
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        SELECT p_shard_key, p_id, p_name || ':wait',
            jsonb_build_object('child_shard_key', p_child_shard_key, 'child_id', p_child_id)
        WHERE EXISTS (SELECT 1 FROM child) AND NOT EXISTS (SELECT 1 FROM finished)
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING
        RETURNING 1
    ), park AS MATERIALIZED (
        UPDATE workflow_status w SET run_at = now() + p_recheck_ms * interval '1 millisecond'
        WHERE w.shard_key = p_shard_key AND w.id = p_id
            AND EXISTS (SELECT 1 FROM child) AND NOT EXISTS (SELECT 1 FROM finished)
        RETURNING w.run_at
    )
    SELECT coalesce((SELECT r.output FROM recorded r), (SELECT x.output FROM written x)),
        EXISTS (SELECT 1 FROM recorded) OR EXISTS (SELECT 1 FROM child),
        (SELECT k.run_at FROM park k), (SELECT count(*) FROM waiting);
END $$;
