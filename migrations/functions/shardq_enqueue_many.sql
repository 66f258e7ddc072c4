-- shardq_enqueue_many: enqueues a batch of jobs on this shard in one
-- statement: p_jobs is a jsonb array of objects with shardq_enqueue's
-- arguments as keys (queue, handler, payload, ordering_key, dedup_id,
-- run_at as ISO 8601 text, priority, max_attempts, group); only queue and handler
-- are required. A jsonb array is what psycopg (Jsonb(list)) and
-- node-postgres (JSON.stringify) pass most simply.
--
-- p_epoch: as shardq_enqueue's, for the whole batch (SQ004 writes none).
--
-- Returns one row per job in input order, job_index counting from 0. The
-- jobs are written in input order, so a key's jobs get ascending ids in the
-- order given. One statement: any job refused (messages start with
-- 'job N: ', SQLSTATEs as shardq_enqueue) writes none of the batch.
--
-- Between its statements (the check of the array, then one
-- shardq_enqueue_row per job) other transactions may enqueue, claim and
-- finish jobs; the array is this call's own, and each job's write is
-- safe against them as shardq_enqueue_row says.
CREATE OR REPLACE FUNCTION shardq_enqueue_many(p_jobs jsonb, p_epoch int DEFAULT NULL)
RETURNS TABLE (job_index int, job_id text, shard_key int, id bigint, is_new boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    bad text;
    j record;
BEGIN
    IF jsonb_typeof(p_jobs) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'shardq_enqueue_many takes a jsonb array of jobs, not %',
            COALESCE(jsonb_typeof(p_jobs), 'NULL') USING ERRCODE = '22023';
    END IF;
    SELECT format('job %s: %s', e.ord - 1, CASE WHEN jsonb_typeof(e.job) <> 'object'
               THEN 'a job is a JSON object, not ' || jsonb_typeof(e.job)
               ELSE format('unknown field `%s`', k.key) END)
        INTO bad
        FROM jsonb_array_elements(p_jobs) WITH ORDINALITY AS e(job, ord)
        LEFT JOIN LATERAL (
            SELECT key FROM jsonb_object_keys(CASE WHEN jsonb_typeof(e.job) = 'object'
                                                   THEN e.job ELSE '{}' END) AS key
            WHERE key NOT IN ('queue', 'handler', 'payload', 'ordering_key', 'dedup_id',
                              'run_at', 'priority', 'max_attempts', 'group')) k ON true
        WHERE jsonb_typeof(e.job) <> 'object' OR k.key IS NOT NULL
        ORDER BY e.ord LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION '%', bad USING ERRCODE = '22023',
            HINT = 'a job''s fields: queue, handler, payload, ordering_key, dedup_id, run_at, '
                   'priority, max_attempts, group';
    END IF;
    FOR j IN SELECT * FROM ROWS FROM (jsonb_to_recordset(p_jobs) AS (queue text,
                 handler text, payload jsonb, ordering_key text, dedup_id text,
                 run_at timestamptz, priority int, max_attempts int, "group" text))
                 WITH ORDINALITY
                 AS t(queue, handler, payload, ordering_key, dedup_id, run_at, priority,
                      max_attempts, job_group, ord)
             ORDER BY t.ord
    LOOP
        RETURN QUERY SELECT (j.ord - 1)::int, r.job_id, r.shard_key, r.id, r.is_new
            FROM shardq_enqueue_row(format('job %s: ', j.ord - 1), j.queue, j.handler,
                                    j.payload, j.ordering_key, j.dedup_id, j.run_at,
                                    j.priority, j.max_attempts, p_epoch, j.job_group) r;
    END LOOP;
END $$;
