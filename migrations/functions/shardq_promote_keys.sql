-- shardq_promote_keys: releases the keys of these jobs: a key with nothing
-- running, scheduled or queued from its floor on gets its lowest waiting
-- job queued. Call with the keys locked, in a statement after the one that
-- changed them. Returns how many were queued.
--
-- Each key's jobs are read from its floor (shardq_key_floors, migration
-- 44), so the reads walk only the versions of jobs the key ran since its
-- floor last moved, however long a transaction holds vacuum back. Below
-- the floor a key has no unfinished job but one that committed after the
-- floor passed its id, queued or delayed, which holds nothing back until a
-- claim meets it as its key's head and lowers the floor
-- (shardq_claim_keyed; docs/guarantees.md). Each read orders by (status,
-- id): its status is fixed (shardq_key_jobs_from), so the key index's
-- order serves it and the walk stops at its first live entry.
--
-- One call in `shardq.key_floor_every` (default 8) per key then moves the
-- floor up to the key's lowest unfinished job, and never past the highest
-- of these jobs plus one: often enough that the walks stay short, seldom
-- enough that the floor row's own versions do too. Only under READ
-- COMMITTED (shardq's sessions): the move relies on each statement seeing
-- what committed before it.
--
-- The move compares the floor row's xmin with the one it read: a trigger
-- that lowered the floor meanwhile (shardq_key_floor_lower: a job brought
-- back or written below it, which this statement's snapshot may not see)
-- made a new version, and the move leaves it. A key without a row gets one
-- only if none was written meanwhile. Between the statements below, claims
-- of these keys skip them while the caller holds the key locks (every
-- caller but a range's release, whose keys' jobs are all held then); an
-- enqueue writes ids above the floor, or a late one that a claim meets as
-- its key's head.
--
-- Its statements keep one generic plan per session (force_generic_plan):
-- left to choose, the session planned the floor's move for every call, at
-- 5 ms for a completion of 375 jobs (a third of what the release cost).
CREATE OR REPLACE FUNCTION shardq_promote_keys(p_sk int[], p_id bigint[]) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    promoted integer;
    mv_queue text[]; mv_key text[]; mv_floor bigint[]; mv_xmin xid[];  -- floors to move
    every_setting text := current_setting('shardq.key_floor_every', true);
    every float8 := CASE
        WHEN current_setting('transaction_isolation') <> 'read committed' THEN 'infinity'
        WHEN every_setting ~ '^[1-9][0-9]{0,8}$' THEN every_setting::float8
        ELSE 8 END;
BEGIN
    WITH keys AS (
        SELECT DISTINCT w.queue, w.ordering_key
        FROM unnest(p_sk, p_id) AS j(shard_key, id)
        JOIN workflow_status w ON w.shard_key = j.shard_key AND w.id = j.id
        WHERE w.ordering_key IS NOT NULL
    ), bounded AS MATERIALIZED (
        -- Each floor probed by its key (a scalar subquery): joined, a plan
        -- made while the floors were few read them all, every key's row
        -- and its versions.
        SELECT k.queue, k.ordering_key, coalesce(
            (SELECT f.floor_id FROM shardq_key_floors f
             WHERE f.queue = k.queue AND f.ordering_key = k.ordering_key), 0) AS floor_id
        FROM keys k
    ), released AS (
        -- One status per probe (shardq_key_jobs_from): each walks its
        -- key's entries of that status from the floor on. Scalar
        -- subqueries, not NOT EXISTS: the planner turned those into anti
        -- joins whose inner scan walked every running job of the index.
        SELECT k.queue, k.ordering_key, k.floor_id FROM bounded k
        WHERE (SELECT 1 FROM workflow_status a
               WHERE a.queue = k.queue AND a.ordering_key = k.ordering_key
                 AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'running', k.floor_id)
               LIMIT 1) IS NULL
          AND (SELECT 1 FROM workflow_status a
               WHERE a.queue = k.queue AND a.ordering_key = k.ordering_key
                 AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'scheduled', k.floor_id)
               LIMIT 1) IS NULL
          AND (SELECT 1 FROM workflow_status a
               WHERE a.queue = k.queue AND a.ordering_key = k.ordering_key
                 AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'queued', k.floor_id)
               LIMIT 1) IS NULL
    ), heads AS (
        SELECT n.shard_key, n.id FROM released k CROSS JOIN LATERAL (
            SELECT w.shard_key, w.id FROM workflow_status w
            WHERE w.queue = k.queue AND w.ordering_key = k.ordering_key
              AND shardq_key_jobs_from(w.ordering_key, w.status, w.id, 'waiting', k.floor_id)
            ORDER BY w.status, w.id LIMIT 1) n
    )
    UPDATE workflow_status w SET status = 'queued'
    FROM heads h
    WHERE w.shard_key = h.shard_key AND w.id = h.id AND w.status = 'waiting';
    GET DIAGNOSTICS promoted = ROW_COUNT;

    -- Move the floors of some of these keys up (a statement of its own: it
    -- sees the job just queued), then write them one key at a time (an
    -- update or insert by the whole key stays on its index).
    WITH keys AS MATERIALIZED (
        SELECT w.queue, w.ordering_key, max(w.id) AS last_id
        FROM unnest(p_sk, p_id) AS j(shard_key, id)
        JOIN workflow_status w ON w.shard_key = j.shard_key AND w.id = j.id
        WHERE w.ordering_key IS NOT NULL
        GROUP BY w.queue, w.ordering_key
        HAVING random() * every < 1
    ), bounded AS MATERIALIZED (
        SELECT k.queue, k.ordering_key, k.last_id, coalesce(f.floor_id, 0) AS floor_id,
               f.row_xmin
        FROM keys k LEFT JOIN LATERAL (
            SELECT r.floor_id, r.xmin AS row_xmin FROM shardq_key_floors r
            WHERE r.queue = k.queue AND r.ordering_key = k.ordering_key
            LIMIT 1) f ON true
    ), moved AS (
        SELECT b.queue, b.ordering_key, b.row_xmin, b.floor_id AS was,
            least(
                (SELECT a.id FROM workflow_status a
                 WHERE a.queue = b.queue AND a.ordering_key = b.ordering_key
                   AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'running', b.floor_id)
                 ORDER BY a.status, a.id LIMIT 1),
                (SELECT a.id FROM workflow_status a
                 WHERE a.queue = b.queue AND a.ordering_key = b.ordering_key
                   AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'scheduled', b.floor_id)
                 ORDER BY a.status, a.id LIMIT 1),
                (SELECT a.id FROM workflow_status a
                 WHERE a.queue = b.queue AND a.ordering_key = b.ordering_key
                   AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'queued', b.floor_id)
                 ORDER BY a.status, a.id LIMIT 1),
                (SELECT a.id FROM workflow_status a
                 WHERE a.queue = b.queue AND a.ordering_key = b.ordering_key
                   AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'waiting', b.floor_id)
                 ORDER BY a.status, a.id LIMIT 1),
                b.last_id + 1) AS floor_id
        FROM bounded b
    )
    SELECT coalesce(array_agg(m.queue), '{}'), coalesce(array_agg(m.ordering_key), '{}'),
           coalesce(array_agg(m.floor_id), '{}'), coalesce(array_agg(m.row_xmin), '{}')
    INTO mv_queue, mv_key, mv_floor, mv_xmin
    FROM moved m WHERE m.floor_id > m.was;
    FOR i IN 1 .. cardinality(mv_key) LOOP
        IF mv_xmin[i] IS NULL THEN
            INSERT INTO shardq_key_floors (queue, ordering_key, floor_id)
            VALUES (mv_queue[i], mv_key[i], mv_floor[i])
            ON CONFLICT DO NOTHING;
        ELSE
            UPDATE shardq_key_floors f SET floor_id = mv_floor[i], set_at = now()
            WHERE f.queue = mv_queue[i] AND f.ordering_key = mv_key[i]
              AND f.xmin = mv_xmin[i];
        END IF;
    END LOOP;
    RETURN promoted;
END $$;
