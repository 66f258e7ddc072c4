-- shardq_step_log: every recorded step of workflow (p_shard_key, p_id),
-- with whether the claim (p_owner, p_fence) holds it and for how many more
-- µs its lease runs by the shard's clock (no other claim can take the
-- workflow, nor record a step of it, before then). One row per step; one
-- row with NULL step columns when none is recorded; no row when the
-- workflow is gone. Read by a run at its first step that memory cannot
-- answer (src/worker/step_log.rs). A read: one statement, one snapshot.
--
-- A function rather than a statement for its plan: shardq's sessions plan
-- each statement for its parameters (src/shards.rs), which cost more than
-- running these primary-key lookups; here the plan is made once per
-- session (`shardq bench sleepers --statements`).
CREATE OR REPLACE FUNCTION shardq_step_log(p_shard_key int, p_id bigint, p_owner text, p_fence bigint)
RETURNS TABLE (step_name text, output jsonb, held boolean, lease_left_us bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT s.step_name, s.output, w.held, w.lease_left_us
    FROM (SELECT owner IS NOT DISTINCT FROM p_owner AND fence = p_fence AND status = 'running' AS held,
                 greatest(0, extract(epoch FROM lease_expires_at - clock_timestamp())
                     * 1000000)::bigint AS lease_left_us
          FROM workflow_status WHERE shard_key = p_shard_key AND id = p_id) w
    LEFT JOIN workflow_steps s ON s.shard_key = p_shard_key AND s.workflow_id = p_id;
END $$;
