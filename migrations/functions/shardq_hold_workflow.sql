-- shardq_hold_workflow: the first statement of a recv step
-- (shardq_recv) and of a child's result step (shardq_child_result):
-- locks workflow (p_shard_key, p_id)'s row FOR UPDATE (conflicts with a
-- send's lock, a completion, a recovery, a cancellation) and says whether
-- the claim (p_owner, p_fence) still holds it and whether its
-- cancellation was asked. No row when the workflow is gone. Between it and
-- the step's deciding statement no writer changes what that decides: a
-- send, a step record, a recovery, a cancellation, the job's deletion and
-- a child's wake of its parent all need a lock that conflicts with this
-- one (src/store/sql/messages.rs, src/store/sql/children.rs).
--
-- Planned once per session (shardq_step_log says why).
CREATE OR REPLACE FUNCTION shardq_hold_workflow(p_shard_key int, p_id bigint, p_owner text,
    p_fence bigint)
RETURNS TABLE (owned boolean, cancel_requested boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    SELECT w.owner IS NOT DISTINCT FROM p_owner AND w.fence = p_fence AND w.status = 'running',
        w.cancel_requested
    FROM workflow_status w WHERE w.shard_key = p_shard_key AND w.id = p_id FOR UPDATE;
END $$;
