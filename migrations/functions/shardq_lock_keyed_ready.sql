-- shardq_lock_keyed_ready: locks up to p_limit ready keyed jobs of p_queue
-- (the heads a keyed claim tries the keys of) with SKIP LOCKED, by
-- priority, then in the order they became ready, and returns their tuple
-- ids. Called after shardq_lock_plain_ready, which moves the floors.
--
-- Each priority's scan starts at its keyed floor (keyed_floor_seq of
-- shardq_ready_floors, migration 0037), not at the start of the index: a
-- claim walks only the keyed jobs claimed since the last move of the
-- floors, however long a transaction holds vacuum back. Each key's own
-- jobs are then read by key (shardq_claim_keyed), which walks that key's
-- history only.
CREATE OR REPLACE FUNCTION shardq_lock_keyed_ready(p_queue text, p_limit int) RETURNS tid[]
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    f record;
    tids tid[] := '{}';
BEGIN
    FOR f IN SELECT fl.priority, fl.keyed_floor_seq FROM shardq_ready_floors fl
             WHERE fl.queue = p_queue ORDER BY fl.priority LOOP
        tids := tids || ARRAY(
            SELECT t.tid FROM (
                SELECT w.ctid AS tid FROM workflow_status w
                WHERE w.queue = p_queue AND w.priority = f.priority
                  AND w.status = 'queued' AND w.ordering_key IS NOT NULL
                  AND w.ready_seq >= f.keyed_floor_seq
                ORDER BY w.ready_seq LIMIT p_limit - cardinality(tids)
                FOR UPDATE SKIP LOCKED) t);
        EXIT WHEN cardinality(tids) >= p_limit;
    END LOOP;
    RETURN tids;
END $$;
