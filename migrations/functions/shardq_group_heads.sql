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
CREATE OR REPLACE FUNCTION shardq_group_heads(p_queue text, p_from int, p_below bigint,
                                              p_max int, OUT names text[], OUT heads tid[])
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE walk(h, g, head, n) AS (
        (SELECT hashtext(w.job_group), w.job_group, w.ctid, 1 FROM workflow_status w
         WHERE w.queue = p_queue AND w.status >= 'queued' AND w.status <= 'queued'
           AND w.job_group IS NOT NULL
           AND hashtext(w.job_group) >= p_from AND hashtext(w.job_group) < p_below
         ORDER BY hashtext(w.job_group), w.job_group, w.priority, w.turn, w.id LIMIT 1)
        UNION ALL
        SELECT x.h, x.g, x.head, v.n + 1 FROM walk v CROSS JOIN LATERAL (
            SELECT hashtext(w.job_group) AS h, w.job_group AS g, w.ctid AS head
            FROM workflow_status w
            WHERE w.queue = p_queue AND w.status >= 'queued' AND w.status <= 'queued'
              AND w.job_group IS NOT NULL
              AND (hashtext(w.job_group), w.job_group) > (v.h, v.g)
              AND hashtext(w.job_group) < p_below
            ORDER BY hashtext(w.job_group), w.job_group, w.priority, w.turn, w.id LIMIT 1) x
        WHERE v.n < p_max
    )
    SELECT coalesce(array_agg(g ORDER BY n), '{}'), coalesce(array_agg(head ORDER BY n), '{}')
    FROM walk
$$;
