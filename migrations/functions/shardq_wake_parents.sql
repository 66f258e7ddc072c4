-- shardq_wake_parents: the wakes a child's completion left to the
-- promotion (its parent's row was locked then; shardq_child_finished):
-- up to p_limit flagged children, each parent tried again
-- (shardq_wake_parent) and the flag cleared when done. Children another
-- pass holds are skipped, and a parent still locked keeps its child's
-- flag for the next pass: nothing here waits for a lock, so it cannot
-- deadlock with a completion (which holds children and tries parents).
-- Returns how many wakes it settled.
CREATE OR REPLACE FUNCTION shardq_wake_parents(p_limit int)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    c record;
    settled bigint := 0;
BEGIN
    FOR c IN SELECT w.shard_key, w.id, w.parent_shard_key, w.parent_id FROM workflow_status w
            WHERE w.parent_wake AND shardq_owns_key(w.parent_shard_key)
            ORDER BY w.shard_key, w.id LIMIT p_limit
            FOR UPDATE SKIP LOCKED LOOP
        IF shardq_wake_parent(c.parent_shard_key, c.parent_id, c.shard_key, c.id) THEN
            UPDATE workflow_status SET parent_wake = NULL
                WHERE shard_key = c.shard_key AND id = c.id;
            settled := settled + 1;
        END IF;
    END LOOP;
    RETURN settled;
END $$;
