-- shardq_lock_keys: waits for the key locks of these jobs' keys, in sorted
-- order (so two lockers never deadlock).
CREATE OR REPLACE FUNCTION shardq_lock_keys(p_sk int[], p_id bigint[]) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(l) FROM (
        SELECT DISTINCT shardq_key_lock(w.queue, w.ordering_key) AS l
        FROM unnest(p_sk, p_id) AS j(shard_key, id)
        JOIN workflow_status w ON w.shard_key = j.shard_key AND w.id = j.id
        WHERE w.ordering_key IS NOT NULL
        ORDER BY 1) sorted;
END $$;
