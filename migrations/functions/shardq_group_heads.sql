-- shardq_group_heads: the hashes of up to p_max groups of p_queue with ready
-- jobs, in hash order from p_from (inclusive) to p_below (exclusive): a
-- skip scan of workflow_status_dequeue_grouped, one index probe per group
-- however many jobs each holds. For shardq_claim_grouped.
CREATE OR REPLACE FUNCTION shardq_group_heads(p_queue text, p_from int, p_below bigint,
                                              p_max int)
RETURNS int[]
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE walk(h, n) AS (
        (SELECT hashtext(w.job_group), 1 FROM workflow_status w
         WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL
           AND hashtext(w.job_group) >= p_from AND hashtext(w.job_group) < p_below
         ORDER BY hashtext(w.job_group) LIMIT 1)
        UNION ALL
        SELECT (SELECT hashtext(w.job_group) FROM workflow_status w
                WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL
                  AND hashtext(w.job_group) > v.h AND hashtext(w.job_group) < p_below
                ORDER BY hashtext(w.job_group) LIMIT 1), v.n + 1
        FROM walk v WHERE v.h IS NOT NULL AND v.n < p_max
    )
    SELECT coalesce(array_agg(h ORDER BY n) FILTER (WHERE h IS NOT NULL), '{}') FROM walk
$$;
