-- shardq_wake_parent: child (p_child_shard_key, p_child_id) of parent
-- (p_shard_key, p_parent_id), on this shard, has finished: wakes the parent when one of its
-- `ChildHandle::result` steps waits on this child, as a send wakes a
-- parked recv (src/store/sql/messages.rs, MESSAGE_SEND_WRITE): `run_at` is
-- now, and a parked (`scheduled`) parent is queued at once, a keyed one
-- when the try of its key's lock succeeds (else the promotion of due jobs
-- queues it, within the maintenance interval); a running one (its result
-- step has recorded the wait, its `parked` outcome is not written yet)
-- is made due, so that outcome leaves it due. Idle workers are notified.
--
-- The parent's row lock is TRIED, never waited for: the caller holds the
-- child's row (and, in a completion, a whole batch of rows, some of which
-- may be parents that another completion waits to wake); a wait here
-- could close a cycle. Returns false when the parent's row is locked by
-- another transaction now: the caller leaves the wake to the promotion
-- (the child's `parent_wake` flag, shardq_wake_parents), and when the
-- parent's key is not this shard's (the promotion's relay calls this
-- function on the parent's shard). True when it is done: the parent was
-- woken, did not wait on this child, or is gone.
--
-- Ordering with the parent's park (CHILD_RESULT_LOCK then
-- CHILD_RESULT_DECIDE, src/store/sql/children.rs): both need the parent's
-- row lock. When this lock is granted first, the park's decision, a later
-- statement run after this transaction commits, sees the child finished
-- and does not park. When the park's commits first, the wake statement
-- below (a statement of its own, so a snapshot taken after the lock was
-- granted) sees its recorded wait. Between the lock and the wake no other
-- writer changes what the wake decides: every writer of the parent's
-- status, run_at or cancel request, and the park's wait record, takes a
-- lock that conflicts with this one.
CREATE OR REPLACE FUNCTION shardq_wake_parent(p_shard_key int, p_parent_id bigint,
    p_child_shard_key int, p_child_id bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    got boolean;
    notifies bigint;
BEGIN
    SELECT true INTO got FROM workflow_status
        WHERE shard_key = p_shard_key AND id = p_parent_id AND status <> 'held'
        FOR NO KEY UPDATE SKIP LOCKED;
    IF got IS NULL THEN
        -- Locked, or held by a move of its range (it is woken after the
        -- move, from the flag): left to a later try. Missing: gone, or on
        -- another shard (a child started across shards, or a parent whose
        -- range moved, or has not come here yet while its range moves),
        -- where the relay wakes it (src/store/children_elsewhere.rs).
        RETURN NOT EXISTS (SELECT 1 FROM workflow_status
                WHERE shard_key = p_shard_key AND id = p_parent_id)
            AND shardq_owns_key(p_shard_key)
            AND NOT EXISTS (SELECT 1 FROM shardq_map_moves v
                WHERE v.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e)
                  AND v.state <> 'released'
                  AND v.first_key <= p_shard_key AND p_shard_key < v.end_key);
    END IF;
    WITH waiting AS MATERIALIZED (
        SELECT 1 FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_parent_id
            AND s.step_name LIKE 'shardq:child:%:wait'
            AND (s.output->>'child_id')::bigint = p_child_id
            AND (s.output->>'child_shard_key')::int = p_child_shard_key
            AND NOT EXISTS (SELECT 1 FROM workflow_steps d
                WHERE d.shard_key = p_shard_key AND d.workflow_id = p_parent_id
                    AND d.step_name = left(s.step_name, -length(':wait')))
        LIMIT 1
    ), woken AS MATERIALIZED (
        -- The clock at the update, after the row's lock: later than the
        -- claim of a running parent (shardq_child_wait relies on it).
        UPDATE workflow_status w SET run_at = clock_timestamp(),
            status = CASE WHEN w.status = 'scheduled' AND (w.ordering_key IS NULL
                    OR pg_try_advisory_xact_lock(shardq_key_lock(w.queue, w.ordering_key)))
                THEN 'queued' ELSE w.status END
        WHERE w.shard_key = p_shard_key AND w.id = p_parent_id
            AND EXISTS (SELECT 1 FROM waiting)
            AND w.status IN ('scheduled', 'running') AND NOT w.cancel_requested
        RETURNING w.status, w.queue
    ), notified AS MATERIALIZED (
        SELECT pg_notify('shardq_ready', queue) FROM woken WHERE status = 'queued'
    )
    SELECT count(*) INTO notifies FROM notified;
    RETURN true;
END $$;
