-- shardq_enqueue: enqueues one job on this shard from any language, in the
-- caller's transaction (the job exists only if it commits) or on its own;
-- it keeps no session state, so it works through a transaction pooler.
-- Returns the job's id (`shard_key-id`, as `shardq job show` takes it),
-- its parts, and whether this call wrote it (false: an unfinished job of
-- the queue holds the deduplication id; its id is returned).
--
-- Checks, routing and errors: shardq_enqueue_row (SQLSTATE 22023 invalid
-- input, SQ001 wrong shard, SQ002 no shard map, SQ003 deduplication id
-- contended, SQ004 stale shard map). p_epoch: the map epoch the caller
-- routed by (shardq_route's epoch); another than this shard's current one
-- is refused with SQ004 and nothing written; NULL: the current epoch.
-- p_group: the job's group (a tenant, an account), whose jobs take turns
-- with other groups' and share their group's limits; a grouped job is
-- placed by its group (shardq_route(p_group) names its shard).
-- docs/enqueue-from-sql.md shows its use.
CREATE OR REPLACE FUNCTION shardq_enqueue(p_queue text, p_handler text,
    p_payload jsonb DEFAULT '{}', p_ordering_key text DEFAULT NULL,
    p_dedup_id text DEFAULT NULL, p_run_at timestamptz DEFAULT NULL,
    p_priority int DEFAULT 0, p_max_attempts int DEFAULT NULL, p_epoch int DEFAULT NULL,
    p_group text DEFAULT NULL)
RETURNS TABLE (job_id text, shard_key int, id bigint, is_new boolean)
LANGUAGE sql VOLATILE
AS $$
    SELECT * FROM shardq_enqueue_row('', p_queue, p_handler, p_payload, p_ordering_key,
                                     p_dedup_id, p_run_at, p_priority, p_max_attempts, p_epoch,
                                     p_group)
$$;
