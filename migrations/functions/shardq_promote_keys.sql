-- shardq_promote_keys: releases the keys of these jobs: a key with nothing
-- running, scheduled or queued gets its lowest waiting job queued. Call with
-- the keys locked, in a statement after the one that changed them. Returns
-- how many were queued.
CREATE OR REPLACE FUNCTION shardq_promote_keys(p_sk int[], p_id bigint[]) RETURNS integer
    LANGUAGE plpgsql AS $$
DECLARE
    promoted integer;
BEGIN
    WITH keys AS (
        SELECT DISTINCT w.queue, w.ordering_key
        FROM unnest(p_sk, p_id) AS j(shard_key, id)
        JOIN workflow_status w ON w.shard_key = j.shard_key AND w.id = j.id
        WHERE w.ordering_key IS NOT NULL
    ), released AS (
        SELECT k.queue, k.ordering_key FROM keys k
        WHERE NOT EXISTS (SELECT 1 FROM workflow_status a
                          WHERE a.queue = k.queue AND a.ordering_key = k.ordering_key
                            AND a.status IN ('running', 'scheduled', 'queued'))
    ), heads AS (
        SELECT n.shard_key, n.id FROM released k CROSS JOIN LATERAL (
            SELECT w.shard_key, w.id FROM workflow_status w
            WHERE w.queue = k.queue AND w.ordering_key = k.ordering_key
              AND w.status = 'waiting'
            ORDER BY w.id LIMIT 1) n
    )
    UPDATE workflow_status w SET status = 'queued'
    FROM heads h
    WHERE w.shard_key = h.shard_key AND w.id = h.id AND w.status = 'waiting';
    GET DIAGNOSTICS promoted = ROW_COUNT;
    RETURN promoted;
END $$;
