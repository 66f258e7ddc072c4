-- shardq_lock_plain_ready: locks up to p_limit ready plain jobs of p_queue
-- (no ordering key, no group) with SKIP LOCKED, by priority, then in the
-- order they became ready, and returns their tuple ids (a row this
-- transaction locked cannot move before it ends, so its ctid finds it).
--
-- Each priority's scan starts at its ready floor (shardq_ready_floors,
-- moved up by shardq_advance_ready_floors), not at the start of the index:
-- the versions left by what was claimed before lie behind it, so a claim
-- walks only what was claimed since the last move of the floors, however
-- long a transaction holds vacuum back.
CREATE OR REPLACE FUNCTION shardq_lock_plain_ready(p_queue text, p_limit int) RETURNS tid[]
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    f record;
    tids tid[] := '{}';
BEGIN
    PERFORM shardq_advance_ready_floors();
    FOR f IN SELECT fl.priority, fl.floor_seq FROM shardq_ready_floors fl
             WHERE fl.queue = p_queue ORDER BY fl.priority LOOP
        tids := tids || ARRAY(
            SELECT t.tid FROM (
                SELECT w.ctid AS tid FROM workflow_status w
                WHERE w.queue = p_queue AND w.priority = f.priority
                  AND w.status = 'queued' AND w.ordering_key IS NULL
                  AND w.job_group IS NULL AND w.ready_seq >= f.floor_seq
                ORDER BY w.ready_seq LIMIT p_limit - cardinality(tids)
                FOR UPDATE SKIP LOCKED) t);
        EXIT WHEN cardinality(tids) >= p_limit;
    END LOOP;
    RETURN tids;
END $$;
