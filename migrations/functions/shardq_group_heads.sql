-- shardq_group_heads: up to p_max groups of p_queue with ready jobs, in
-- the order of (hash of the name, name) from p_from (inclusive) to p_below
-- (exclusive): each group's name and the tuple id of its head (its first
-- ready job by priority, turn, id: the order its jobs became ready). A skip
-- scan of the groups' lines (workflow_status_group_lines), one index probe
-- per group however many jobs each holds; two names with the same hash
-- stay two groups. Each branch bounds hashtext(w.job_group) with a plain
-- comparison and states the status as a range: that is what lets it use
-- that index, and no other
-- (migrations/0046_one_group_line_index.sql; a row comparison alone does
-- not bound the hash).
--
-- Only jobs at or past the queue's grouped floor (shardq_group_rounds):
-- no ready job has a turn below it (shardq_move_group_rounds says why), so
-- the entries below it (every job the group ran, but those claimed since
-- the floor last moved) are passed in the index without reading their
-- rows (the test is on an index column), where each was a row to read
-- while a long transaction holds the horizon. Grouped jobs without a turn wait for the
-- next move of the rounds (a claim of the queue makes one within 250 ms),
-- as for claims without group limits.
--
-- plpgsql with a plan kept for the connection: as a LANGUAGE sql
-- function it was planned on every call, once or twice a claim (with the
-- floor's test, a claim of one job took 1.8 ms instead of 4.1 without a
-- hold: bench/results/round32). Whatever the statistics, the line index is the
-- only one whose order the walk reads (no sequential or bitmap scan can
-- give it; tests/it/plans.rs shows which index each branch reads).
CREATE OR REPLACE FUNCTION shardq_group_heads(p_queue text, p_from int, p_below bigint,
                                              p_max int, OUT names text[], OUT heads tid[])
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    from_turn bigint := coalesce((SELECT r.floor_turn FROM shardq_group_rounds r
                                  WHERE r.queue = p_queue), 0);
BEGIN
    WITH RECURSIVE walk(h, g, head, n) AS (
        (SELECT hashtext(w.job_group), w.job_group, w.ctid, 1 FROM workflow_status w
         WHERE w.queue = p_queue AND w.status >= 'queued' AND w.status <= 'queued'
           AND w.job_group IS NOT NULL
           AND hashtext(w.job_group) >= p_from AND hashtext(w.job_group) < p_below
           AND w.turn >= from_turn
         ORDER BY hashtext(w.job_group), w.job_group, w.priority, w.turn, w.id LIMIT 1)
        UNION ALL
        SELECT x.h, x.g, x.head, v.n + 1 FROM walk v CROSS JOIN LATERAL (
            SELECT hashtext(w.job_group) AS h, w.job_group AS g, w.ctid AS head
            FROM workflow_status w
            WHERE w.queue = p_queue AND w.status >= 'queued' AND w.status <= 'queued'
              AND w.job_group IS NOT NULL
              AND (hashtext(w.job_group), w.job_group) > (v.h, v.g)
              AND hashtext(w.job_group) < p_below
              AND w.turn >= from_turn
            ORDER BY hashtext(w.job_group), w.job_group, w.priority, w.turn, w.id LIMIT 1) x
        WHERE v.n < p_max
    )
    SELECT coalesce(array_agg(g ORDER BY n), '{}'), coalesce(array_agg(head ORDER BY n), '{}')
    INTO names, heads
    FROM walk;
END $$;
