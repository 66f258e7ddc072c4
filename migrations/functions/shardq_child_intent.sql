-- shardq_child_intent: the first write of a child started on another
-- shard (src/worker/children.rs): child step p_step of workflow
-- (p_shard_key, p_id), fenced by the claim (p_owner, p_fence), reserves
-- the child's identity by recording step `p_step:id` = the child's shard
-- key and id (p_child_shard_key, p_child_id: an id the child's shard
-- reserved) with its queue and handler (p_queue, p_handler: the cancel
-- cascade's stand-in for a child not inserted yet names them), unless an
-- earlier run recorded one: then that one is kept
-- and returned. The child's row is inserted on its shard after this
-- commits, with that id (idempotent under its primary key), then step
-- p_step is recorded; so a crash at any point leaves at most one child.
--
-- Returns `started` (p_step is recorded: nothing to do), `reserved` (the
-- identity to insert, now or before), `cancelled` or `not_held` (nothing
-- written), with the identity and the parent's deadline (the child
-- inherits it). The parent's row is read FOR SHARE: a recovery or a
-- cancellation cannot commit between the fence check and the record.
CREATE OR REPLACE FUNCTION shardq_child_intent(p_shard_key int, p_id bigint, p_owner text,
    p_fence bigint, p_step text, p_child_shard_key int, p_child_id bigint,
    p_queue text, p_handler text)
RETURNS TABLE (state text, child_shard_key int, child_id bigint, parent_deadline timestamptz)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    owned boolean;
    cancelled boolean;
    deadline timestamptz;
    recorded jsonb;
BEGIN
    SELECT w.owner IS NOT DISTINCT FROM p_owner AND w.fence = p_fence AND w.status = 'running',
            w.cancel_requested, w.deadline_at
        INTO owned, cancelled, deadline
        FROM workflow_status w WHERE w.shard_key = p_shard_key AND w.id = p_id FOR SHARE;
    SELECT s.output INTO recorded FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_step;
    IF recorded IS NOT NULL THEN
        RETURN QUERY SELECT 'started'::text, (recorded->>'child_shard_key')::int,
            (recorded->>'child_id')::bigint, deadline;
        RETURN;
    END IF;
    IF cancelled THEN
        RETURN QUERY SELECT 'cancelled'::text, NULL::int, NULL::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    IF owned IS NOT TRUE THEN
        RETURN QUERY SELECT 'not_held'::text, NULL::int, NULL::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
    VALUES (p_shard_key, p_id, p_step || ':id',
            jsonb_build_object('child_shard_key', p_child_shard_key, 'child_id', p_child_id,
                       'queue', p_queue, 'handler', p_handler))
    ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING;
    SELECT s.output INTO recorded FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_step || ':id';
    RETURN QUERY SELECT 'reserved'::text, (recorded->>'child_shard_key')::int,
        (recorded->>'child_id')::bigint, deadline;
END $$;

-- The signature before the identity named its queue and handler, kept for
-- the workers of the previous version during a rolling upgrade: their
-- identities name neither, and the cancel cascade's stand-in takes the
-- parent's (src/store/sql/children.rs, CHILDREN_ELSEWHERE).
CREATE OR REPLACE FUNCTION shardq_child_intent(p_shard_key int, p_id bigint, p_owner text,
    p_fence bigint, p_step text, p_child_shard_key int, p_child_id bigint)
RETURNS TABLE (state text, child_shard_key int, child_id bigint, parent_deadline timestamptz)
LANGUAGE sql VOLATILE
AS $$
    SELECT * FROM shardq_child_intent(p_shard_key, p_id, p_owner, p_fence, p_step,
        p_child_shard_key, p_child_id, NULL::text, NULL::text);
$$;
