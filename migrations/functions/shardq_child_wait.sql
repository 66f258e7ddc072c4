-- shardq_child_wait: the first statement of a result step on a child that
-- lives on another shard (src/worker/children.rs): result step p_name of
-- the parent (p_shard_key, p_id), held by the claim (p_owner, p_fence), on
-- child (p_child_shard_key, p_child_id). Locks the parent
-- (shardq_hold_workflow); returns the step's output when it is recorded;
-- else records the wait (step `p_name:wait`, what the child's wake looks
-- for) and sets the parent's `run_at` p_recheck_ms ahead, then returns
-- NULL: the caller reads the child on its shard, and records the result
-- when the child has finished or parks the parent.
--
-- The wait is recorded (and committed) before the child is read: a
-- child's final status committed after that read is relayed to this shard
-- by its shard's promotion (shardq_wake_parent finds the wait and wakes
-- the parent, or makes a running one due); one committed before is seen
-- by the read. Either way no wake-up is lost.
CREATE OR REPLACE FUNCTION shardq_child_wait(p_shard_key int, p_id bigint, p_owner text,
    p_fence bigint, p_name text, p_child_shard_key int, p_child_id bigint,
    p_recheck_ms bigint)
RETURNS TABLE (owned boolean, cancel_requested boolean, output jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    held record;
    recorded jsonb;
BEGIN
    SELECT * INTO held FROM shardq_hold_workflow(p_shard_key, p_id, p_owner, p_fence);
    IF held.cancel_requested IS TRUE OR held.owned IS NOT TRUE THEN
        RETURN QUERY SELECT coalesce(held.owned, false), coalesce(held.cancel_requested, false),
            NULL::jsonb;
        RETURN;
    END IF;
    SELECT s.output INTO recorded FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_name;
    IF recorded IS NULL THEN
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        VALUES (p_shard_key, p_id, p_name || ':wait',
                jsonb_build_object('child_shard_key', p_child_shard_key, 'child_id', p_child_id))
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING;
        -- Pushed out only while no wake came in this run (a wake sets
        -- run_at to its now(), after the claim's started_at; so does a
        -- push by an earlier call of this run, which stands): a second
        -- result() of the run must not undo a wake already delivered.
        UPDATE workflow_status w SET run_at = now() + p_recheck_ms * interval '1 millisecond'
            WHERE w.shard_key = p_shard_key AND w.id = p_id AND w.run_at <= w.started_at;
    END IF;
    RETURN QUERY SELECT true, false, recorded;
END $$;
