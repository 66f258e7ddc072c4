-- shardq_start_child: step p_step of workflow (p_shard_key, p_id) starts
-- its child once (JobContext::start_child): the child's row and the step
-- recording it (`child_shard_key`, `child_id`) are written in this one
-- call, one transaction, so no crash leaves a child without its record
-- (the next run would start a second). A step recorded before returns its
-- child ('recorded'). Fenced as a step record: only while the claim
-- (p_owner, p_fence) holds the running workflow and its cancellation was
-- not asked ('not_held', 'cancelled': nothing written).
--
-- The child lives on its parent's shard: it takes the parent's shard key,
-- or, with an ordering key or a group (p_routing), that key's shard key
-- (its key's jobs share a shard); a key this shard does not own now is
-- refused ('other_shard', child_shard_key its shard key, child_index the
-- shard its range is on): cross-shard children are not supported yet.
-- The child's other fields are the Rust client's, checked by it
-- (NewJob::validate); p_abandon: a cancel of the parent leaves it running; a delay makes it 'scheduled', else it is 'queued'
-- and idle workers are notified.
-- The child inherits its parent's deadline (NewJob::timeout), unless it is
-- abandoned on its parent's cancel (it is meant to outlive the parent); a
-- child with a timeout of its own takes the earlier of the two
-- (store::children::start lowers it in this call's transaction).
--
-- The parent's row is locked FOR SHARE first: a recovery or a cancel
-- cannot commit between the fence check and the writes, and one that
-- committed before is seen. Between that lock and the writes, another
-- attempt of the same workflow (the one lease) cannot record the step:
-- its record is fenced by the same row, whose owner and fence only a
-- writer that conflicts with this lock changes.
CREATE OR REPLACE FUNCTION shardq_start_child(p_shard_key int, p_id bigint, p_owner text,
    p_fence bigint, p_step text, p_queue text, p_handler text, p_payload jsonb,
    p_ordering_key text, p_group text, p_priority int, p_delay_ms bigint,
    p_max_attempts int, p_abandon boolean)
RETURNS TABLE (state text, child_shard_key int, child_id bigint, child_index int)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    owned boolean;
    cancelled boolean;
    parent_deadline timestamptz;
    recorded jsonb;
    routing text := COALESCE(p_ordering_key, p_group);
    k int := p_shard_key;
    k_index int;
    run_at timestamptz := now() + p_delay_ms * interval '1 millisecond';
    new_status text := CASE WHEN p_delay_ms > 0 THEN 'scheduled' ELSE 'queued' END;
    new_id bigint;
BEGIN
    SELECT w.owner IS NOT DISTINCT FROM p_owner AND w.fence = p_fence AND w.status = 'running',
            w.cancel_requested, w.deadline_at
        INTO owned, cancelled, parent_deadline
        FROM workflow_status w WHERE w.shard_key = p_shard_key AND w.id = p_id FOR SHARE;
    SELECT s.output INTO recorded FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_step;
    IF recorded IS NOT NULL THEN
        RETURN QUERY SELECT 'recorded'::text, (recorded->>'child_shard_key')::int,
            (recorded->>'child_id')::bigint, NULL::int;
        RETURN;
    END IF;
    -- A start across shards reserved this child's identity first (step
    -- `p_step:id`, shardq_child_intent): it goes on that way, wherever the
    -- child's key lives now, so the call site keeps its one child.
    SELECT s.output INTO recorded FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_step || ':id';
    IF recorded IS NOT NULL THEN
        RETURN QUERY SELECT 'other_shard'::text, (recorded->>'child_shard_key')::int,
            NULL::bigint, NULL::int;
        RETURN;
    END IF;
    IF cancelled THEN
        RETURN QUERY SELECT 'cancelled'::text, NULL::int, NULL::bigint, NULL::int;
        RETURN;
    END IF;
    IF owned IS NOT TRUE THEN
        RETURN QUERY SELECT 'not_held'::text, NULL::int, NULL::bigint, NULL::int;
        RETURN;
    END IF;
    IF routing IS NOT NULL THEN
        k := shardq_shard_key(routing);
        IF NOT shardq_owns_key(k) THEN
            SELECT r.shard_index INTO k_index FROM shardq_map_ranges r
                WHERE r.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e)
                    AND r.first_key <= k AND k < r.end_key;
            RETURN QUERY SELECT 'other_shard'::text, k, NULL::bigint, k_index;
            RETURN;
        END IF;
    END IF;
    INSERT INTO workflow_status AS w
        (shard_key, queue, handler, ordering_key, priority, payload, status, run_at,
         max_attempts, job_group, parent_shard_key, parent_id, abandon_on_parent_cancel,
         deadline_at)
    VALUES (k, p_queue, p_handler, p_ordering_key, p_priority, p_payload, new_status, run_at,
            p_max_attempts, p_group, p_shard_key, p_id, NULLIF(p_abandon, false),
            CASE WHEN p_abandon THEN NULL ELSE parent_deadline END)
    RETURNING w.id INTO new_id;
    INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
    VALUES (p_shard_key, p_id, p_step,
            jsonb_build_object('child_shard_key', k, 'child_id', new_id));
    IF new_status = 'queued' THEN
        PERFORM pg_notify('shardq_ready', p_queue);
    END IF;
    RETURN QUERY SELECT 'started'::text, k, new_id, NULL::int;
END $$;
