-- shardq_recv: recv step p_name of topic p_topic, waiting p_micros µs at
-- most, by the claim (p_owner, p_fence) of workflow (p_shard_key, p_id):
-- shardq_hold_workflow, then, when the claim holds the workflow and its
-- cancellation was not asked, shardq_recv_take in a statement of its own
-- (src/store/sql/messages.rs says how this is ordered with a send). One
-- call, one transaction, one round trip. Returns the lock's answer
-- (`owned` false also when the workflow is gone) and the take's (NULL
-- when it did not run).
CREATE OR REPLACE FUNCTION shardq_recv(p_shard_key int, p_id bigint, p_owner text,
    p_fence bigint, p_name text, p_topic text, p_micros bigint)
RETURNS TABLE (owned boolean, cancel_requested boolean, output jsonb, wait_recorded bigint,
               parked bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    held record;
BEGIN
    SELECT * INTO held FROM shardq_hold_workflow(p_shard_key, p_id, p_owner, p_fence);
    IF held.cancel_requested IS TRUE OR held.owned IS NOT TRUE THEN
        RETURN QUERY SELECT coalesce(held.owned, false), coalesce(held.cancel_requested, false),
            NULL::jsonb, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, false, t.output, t.wait_recorded, t.parked
        FROM shardq_recv_take(p_shard_key, p_id, p_name, p_topic, p_micros) t;
END $$;
