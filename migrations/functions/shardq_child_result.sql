-- shardq_child_result: result step p_name of the parent (p_shard_key,
-- p_id), held by the claim (p_owner, p_fence), on child
-- (p_child_shard_key, p_child_id): shardq_hold_workflow on the parent,
-- then, when the claim holds it and its cancellation was not asked,
-- shardq_child_result_decide in a statement of its own
-- (src/store/sql/children.rs says how this is ordered with the child's
-- completion). One call, one transaction, one round trip. Returns the
-- lock's answer (`owned` false also when the parent is gone) and the
-- decision's (NULL when it did not run).
CREATE OR REPLACE FUNCTION shardq_child_result(p_shard_key int, p_id bigint, p_owner text,
    p_fence bigint, p_name text, p_child_shard_key int, p_child_id bigint,
    p_recheck_ms bigint)
RETURNS TABLE (owned boolean, cancel_requested boolean, output jsonb, found boolean,
               until timestamptz, wait_recorded bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    held record;
BEGIN
    SELECT * INTO held FROM shardq_hold_workflow(p_shard_key, p_id, p_owner, p_fence);
    IF held.cancel_requested IS TRUE OR held.owned IS NOT TRUE THEN
        RETURN QUERY SELECT coalesce(held.owned, false), coalesce(held.cancel_requested, false),
            NULL::jsonb, NULL::boolean, NULL::timestamptz, NULL::bigint;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, false, d.output, d.found, d.until, d.wait_recorded
        FROM shardq_child_result_decide(p_shard_key, p_id, p_name, p_child_shard_key,
                                        p_child_id, p_recheck_ms) d;
END $$;
