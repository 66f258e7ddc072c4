-- The claim's statements are planned once per connection, not on every call.
--
-- shardq's connections plan every statement for its own parameters
-- (`plan_cache_mode = force_custom_plan`, see src/shards.rs), and that
-- reached the statements inside shardq_claim too: every call planned its
-- probes and its claim again, about 0.2 ms of a server's CPU per claim
-- statement. Under a steady low or moderate offer a claim takes a few jobs,
-- so that planning was most of the database's work per job (`shardq bench
-- scale --rate`: the planner was 26% of four servers' CPU at 2,500 jobs/s).
-- The probes and the unkeyed claim are index walks whatever the parameters
-- (their generic plans are the custom ones, tests/plans.rs), so they keep
-- one plan. The keyed path, whose plans depend on the sizes of the arrays it
-- builds, moves unchanged into shardq_claim_keyed and is still planned for
-- each call.

CREATE OR REPLACE FUNCTION shardq_claim_keyed(p_queue text, p_limit int,
                                   p_owner text, p_lease_ms bigint)
RETURNS TABLE (got_slot int, shard_key int, id bigint, handler text,
               ordering_key text, priority int, payload jsonb, attempts int,
               fence bigint, queue text, created_at timestamptz)
LANGUAGE plpgsql
SET enable_hashjoin = on
SET enable_mergejoin = on
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    c_sk int[]; c_id bigint[]; c_key text[];  -- ready jobs met, in dequeue order
    l_key text[]; l_pos bigint[];             -- keys locked here, and their head's position
    f_key text[]; f_pos bigint[];             -- locked keys nothing holds
    t_sk int[]; t_id bigint[];                -- jobs to claim
    blocked text[];                           -- locked keys something else holds
    held text[];                              -- keys held once this claim commits
    parked int;
    round int := 0;
BEGIN
    LOOP
        round := round + 1;
        WITH unkeyed AS MATERIALIZED (
            SELECT w.shard_key, w.id, w.priority, w.ordering_key FROM workflow_status w
            WHERE w.queue = p_queue AND w.status = 'queued' AND w.ordering_key IS NULL
            ORDER BY w.priority, w.id LIMIT p_limit FOR UPDATE SKIP LOCKED
        ), keyed AS MATERIALIZED (
            SELECT w.shard_key, w.id, w.priority, w.ordering_key FROM workflow_status w
            WHERE w.queue = p_queue AND w.status = 'queued' AND w.ordering_key IS NOT NULL
            ORDER BY w.priority, w.id LIMIT p_limit FOR UPDATE SKIP LOCKED
        ), met AS (
            SELECT * FROM unkeyed UNION ALL SELECT * FROM keyed
        )
        SELECT coalesce(array_agg(m.shard_key ORDER BY m.priority, m.id), '{}'),
               coalesce(array_agg(m.id ORDER BY m.priority, m.id), '{}'),
               coalesce(array_agg(m.ordering_key ORDER BY m.priority, m.id), '{}')
        INTO c_sk, c_id, c_key FROM met m;

        SELECT coalesce(array_agg(d.k ORDER BY d.pos), '{}'),
               coalesce(array_agg(d.pos ORDER BY d.pos), '{}')
        INTO l_key, l_pos FROM (
            SELECT t.k, min(t.pos) AS pos FROM unnest(c_key) WITH ORDINALITY AS t(k, pos)
            WHERE t.k IS NOT NULL GROUP BY t.k) d
        WHERE pg_try_advisory_xact_lock(shardq_key_lock(p_queue, d.k));

        -- A new statement: its snapshot sees all that was done under the key locks.
        SELECT coalesce(array_agg(t.k ORDER BY t.pos) FILTER (WHERE NOT t.busy), '{}'),
               coalesce(array_agg(t.pos ORDER BY t.pos) FILTER (WHERE NOT t.busy), '{}'),
               coalesce(array_agg(t.k) FILTER (WHERE t.busy), '{}')
        INTO f_key, f_pos, blocked FROM (
            SELECT l.k, l.pos, EXISTS (
                SELECT 1 FROM workflow_status a
                WHERE a.queue = p_queue AND a.ordering_key = l.k
                  AND a.status IN ('running', 'scheduled')) AS busy
            FROM unnest(l_key, l_pos) AS l(k, pos)) t;

        WITH pending AS MATERIALIZED (
            SELECT f.k, f.pos, p.shard_key, p.id,
                   row_number() OVER (PARTITION BY f.k ORDER BY p.id) AS rn
            FROM unnest(f_key, f_pos) AS f(k, pos) CROSS JOIN LATERAL (
                SELECT u.shard_key, u.id FROM (
                    (SELECT w.shard_key, w.id FROM workflow_status w
                     WHERE w.queue = p_queue AND w.ordering_key = f.k AND w.status = 'queued'
                     ORDER BY w.id LIMIT p_limit)
                    UNION ALL
                    (SELECT w.shard_key, w.id FROM workflow_status w
                     WHERE w.queue = p_queue AND w.ordering_key = f.k AND w.status = 'waiting'
                     ORDER BY w.id LIMIT p_limit)) u
                ORDER BY u.id LIMIT p_limit) p
        ), got AS MATERIALIZED (
            SELECT w.shard_key, w.id FROM workflow_status w
            WHERE (w.shard_key, w.id) IN (SELECT p.shard_key, p.id FROM pending p)
              AND w.status IN ('queued', 'waiting')
            FOR UPDATE SKIP LOCKED
        ), cut AS (
            SELECT p.k, coalesce(min(p.rn) FILTER (WHERE g.id IS NULL), 9223372036854775807) AS gap
            FROM pending p LEFT JOIN got g ON g.shard_key = p.shard_key AND g.id = p.id
            GROUP BY p.k
        ), offered AS (
            SELECT t.shard_key, t.id, NULL::text AS k, t.pos, 0::bigint AS rn
            FROM unnest(c_sk, c_id, c_key) WITH ORDINALITY AS t(shard_key, id, k, pos)
            WHERE t.k IS NULL
            UNION ALL
            SELECT p.shard_key, p.id, p.k, p.pos, p.rn FROM pending p JOIN cut ON cut.k = p.k
            WHERE p.rn < cut.gap
        ), take AS (
            SELECT * FROM offered o ORDER BY o.pos, o.rn LIMIT p_limit
        )
        SELECT coalesce(array_agg(x.shard_key), '{}'), coalesce(array_agg(x.id), '{}'),
               coalesce(array_agg(DISTINCT x.k) FILTER (WHERE x.k IS NOT NULL), '{}')
        INTO t_sk, t_id, held FROM take x;

        UPDATE workflow_status w SET status = 'running', owner = p_owner,
            attempts = w.attempts + 1, fence = w.fence + 1, started_at = now(),
            lease_expires_at = now() + p_lease_ms * interval '1 millisecond'
        FROM unnest(t_sk, t_id) AS t(shard_key, id)
        WHERE w.shard_key = t.shard_key AND w.id = t.id;

        -- Park the queued jobs of the keys held now: those this claim took,
        -- and the locked ones something else holds (bounded per claim).
        UPDATE workflow_status w SET status = 'waiting'
        FROM (
            SELECT q.shard_key, q.id FROM workflow_status q
            WHERE (q.shard_key, q.id) IN (
                SELECT n.shard_key, n.id FROM unnest(held || blocked) AS h(k)
                CROSS JOIN LATERAL (
                    SELECT w2.shard_key, w2.id FROM workflow_status w2
                    WHERE w2.queue = p_queue AND w2.ordering_key = h.k AND w2.status = 'queued'
                    ORDER BY w2.id LIMIT p_limit) n
                LIMIT 4 * p_limit)
              AND q.status = 'queued'
            FOR UPDATE SKIP LOCKED) p
        WHERE w.shard_key = p.shard_key AND w.id = p.id;
        GET DIAGNOSTICS parked = ROW_COUNT;

        EXIT WHEN cardinality(t_id) > 0 OR parked = 0 OR round >= 4;
    END LOOP;

    -- The rows as this transaction left them (one primary-key probe each).
    RETURN QUERY
    SELECT 1, w.shard_key, w.id, w.handler, w.ordering_key, w.priority, w.payload,
           w.attempts, w.fence, w.queue, w.created_at
    FROM (SELECT 1) AS one
    LEFT JOIN (unnest(t_sk, t_id) AS t(shard_key, id)
               JOIN workflow_status w ON w.shard_key = t.shard_key AND w.id = t.id) ON true
    ORDER BY w.id;
END $$;

CREATE OR REPLACE FUNCTION shardq_claim(p_lock_class int, p_slots int, p_queue text,
                             p_limit int, p_owner text, p_lease_ms bigint)
RETURNS TABLE (got_slot int, shard_key int, id bigint, handler text,
               ordering_key text, priority int, payload jsonb, attempts int,
               fence bigint, queue text, created_at timestamptz)
LANGUAGE plpgsql
-- Joins between the statement's own small sets need hash joins (see 0011).
SET enable_hashjoin = on
SET enable_mergejoin = on
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    -- A paused queue answers "empty" before any lock is tried: one probe of
    -- a table of a few rows per claim statement.
    IF EXISTS (SELECT 1 FROM shardq_paused_queues p WHERE p.queue = p_queue) THEN
        RETURN QUERY SELECT 1, NULL::int, NULL::bigint, NULL::text, NULL::text, NULL::int,
            NULL::jsonb, NULL::int, NULL::bigint, NULL::text, NULL::timestamptz;
        RETURN;
    END IF;
    IF p_slots > 0 AND NOT EXISTS (
            SELECT 1 FROM generate_series(0, p_slots - 1) AS s
            WHERE pg_try_advisory_xact_lock(p_lock_class, s)) THEN
        RETURN QUERY SELECT 0, NULL::int, NULL::bigint, NULL::text, NULL::text, NULL::int,
            NULL::jsonb, NULL::int, NULL::bigint, NULL::text, NULL::timestamptz;
        RETURN;
    END IF;
    -- No keyed job ready: unkeyed jobs have no order to keep, so they are
    -- locked and claimed in one statement, each row probed once.
    IF NOT EXISTS (SELECT 1 FROM workflow_status w
                   WHERE w.queue = p_queue AND w.status = 'queued'
                     AND w.ordering_key IS NOT NULL) THEN
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT w.ctid AS tid FROM workflow_status w
            WHERE w.queue = p_queue AND w.status = 'queued' AND w.ordering_key IS NULL
            ORDER BY w.priority, w.id LIMIT p_limit FOR UPDATE SKIP LOCKED
        ), claimed AS (
            UPDATE workflow_status w SET status = 'running', owner = p_owner,
                attempts = w.attempts + 1, fence = w.fence + 1, started_at = now(),
                lease_expires_at = now() + p_lease_ms * interval '1 millisecond'
            FROM picked p
            WHERE w.ctid = p.tid
            RETURNING w.shard_key, w.id, w.handler, w.ordering_key, w.priority, w.payload,
                w.attempts, w.fence, w.queue, w.created_at
        )
        SELECT 1, c.shard_key, c.id, c.handler, c.ordering_key, c.priority, c.payload,
               c.attempts, c.fence, c.queue, c.created_at
        FROM (SELECT 1) AS one LEFT JOIN claimed c ON true
        ORDER BY c.id;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM shardq_claim_keyed(p_queue, p_limit, p_owner, p_lease_ms);
END $$;
