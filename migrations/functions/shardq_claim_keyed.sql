-- shardq_claim_keyed: the keyed path of the claim (shardq_claim.sql says what
-- a claim does and returns). Called by shardq_claim, with the dequeue slot
-- already taken, when the queue has a keyed job ready.
--
-- Ready unkeyed jobs and key heads are locked from their ready floors
-- (shardq_lock_plain_ready, shardq_lock_keyed_ready: a claim does not walk
-- what was claimed before, however long a transaction holds vacuum back)
-- and met in the order they became ready. For each head's key the claim
-- *tries* the key lock (someone else has it: leave the head for a later
-- claim), then, in a new statement whose snapshot sees every change made
-- under that lock, asks whether the key is held. A
-- free key is claimed as a run: its queued and waiting jobs in id order, cut
-- at the first row another transaction has locked. The jobs taken are the
-- first p_limit of the unkeyed jobs and the runs, in dequeue order of the
-- unkeyed job or the run's head (a run is cut, never split); runs are read
-- and locked only until p_limit keyed jobs that could be taken were met.
-- The queued jobs of every key held now (blocked, or taken by this claim)
-- are parked as 'waiting', so no later claim meets them again. A round
-- that takes nothing but parks something scans again (at most four rounds).
--
-- Each key's jobs are read from its floor (shardq_key_floors, migration 44),
-- or from its head when the head lies below it (a job that committed after
-- a completion moved the floor past its number): so they walk only what the
-- key ran since its floor moved, however long a transaction holds vacuum
-- back. A head below its key's floor lowers the floor, under the key lock,
-- before this claim takes or parks it: the reads of later claims and
-- completions then see it.
--
-- Its statements keep one generic plan per session (force_generic_plan):
-- planned for each call, as shardq's sessions plan by default, they cost
-- more than they run when a claim takes a few jobs (2.2 ms against 0.47 ms
-- per claim of one keyed job, measured on PostgreSQL 15), and a claim of
-- 1,000 keyed jobs runs no slower with them. Joins between the function's
-- own small sets (the jobs a parking reads) need hash joins, which shardq's
-- connections turn off for the big-table statements; the runs are read and
-- cut row by row instead (joined, a generic plan compared every pair).
CREATE OR REPLACE FUNCTION shardq_claim_keyed(p_queue text, p_limit int,
                                   p_owner text, p_lease_ms bigint)
RETURNS SETOF shardq_claimed
LANGUAGE plpgsql
SET enable_hashjoin = on
SET enable_mergejoin = on
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    c_tid tid[]; c_key text[]; c_id bigint[]; -- ready jobs met, in dequeue order
    l_key text[]; l_pos bigint[];             -- keys locked here, and their head's position
    l_head bigint[];                          -- ... and their lowest head's id
    l_floor bigint[];                         -- ... and their floor
    l_from bigint[];                          -- ... and the id their reads start at
    f_key text[]; f_pos bigint[]; f_from bigint[]; -- locked keys nothing holds
    t_tid tid[] := '{}';                      -- jobs to claim
    blocked text[];                           -- locked keys something else holds
    held text[];                              -- keys held once this claim commits
    parked int;
    round int := 0;
    plain_tids tid[];                         -- ready unkeyed jobs locked here
    head_tids tid[];                          -- ready keyed jobs locked here
BEGIN
    LOOP
        round := round + 1;
        plain_tids := shardq_lock_plain_ready(p_queue, p_limit);
        head_tids := shardq_lock_keyed_ready(p_queue, p_limit);
        WITH met AS MATERIALIZED (
            SELECT w.ctid AS tid, w.ready_seq, w.priority, w.ordering_key, w.id
            FROM workflow_status w
            WHERE w.ctid = ANY (plain_tids || head_tids)
        )
        SELECT coalesce(array_agg(m.tid ORDER BY m.priority, m.ready_seq), '{}'),
               coalesce(array_agg(m.ordering_key ORDER BY m.priority, m.ready_seq), '{}'),
               coalesce(array_agg(m.id ORDER BY m.priority, m.ready_seq), '{}')
        INTO c_tid, c_key, c_id FROM met m;

        SELECT coalesce(array_agg(d.k ORDER BY d.pos), '{}'),
               coalesce(array_agg(d.pos ORDER BY d.pos), '{}'),
               coalesce(array_agg(d.head ORDER BY d.pos), '{}')
        INTO l_key, l_pos, l_head FROM (
            SELECT t.k, min(t.pos) AS pos, min(t.id) AS head
            FROM unnest(c_key, c_id) WITH ORDINALITY AS t(k, id, pos)
            WHERE t.k IS NOT NULL GROUP BY t.k) d
        WHERE pg_try_advisory_xact_lock(shardq_key_lock(p_queue, d.k));

        -- New statements: their snapshots see all that was done under the
        -- key locks. Each key's floor is probed by its key (a scalar
        -- subquery; joined, a plan made while the floors were few read them
        -- all, every key's row and its versions, on every claim). A head
        -- below its key's floor (a late job) lowers the floor, one key at a
        -- time: rare, and an update by the whole key stays on its index.
        SELECT coalesce(array_agg(coalesce(
                   (SELECT f.floor_id FROM shardq_key_floors f
                    WHERE f.queue = p_queue AND f.ordering_key = l.k), 0) ORDER BY l.pos), '{}')
        INTO l_floor FROM unnest(l_key, l_pos) AS l(k, pos);
        FOR i IN 1 .. cardinality(l_key) LOOP
            IF l_head[i] < l_floor[i] THEN
                UPDATE shardq_key_floors f SET floor_id = l_head[i], set_at = now()
                WHERE f.queue = p_queue AND f.ordering_key = l_key[i]
                  AND f.floor_id > l_head[i];
            END IF;
        END LOOP;

        WITH bounded AS (
            SELECT l.k, l.pos, least(l.head, l.floor) AS from_id
            FROM unnest(l_key, l_pos, l_head, l_floor) AS l(k, pos, head, floor)
        ), checked AS MATERIALIZED (
            -- One status per probe (shardq_key_jobs_from): each walks its
            -- key's entries of that status from the id on.
            SELECT b.k, b.pos, b.from_id, EXISTS (
                    SELECT 1 FROM workflow_status a
                    WHERE a.queue = p_queue AND a.ordering_key = b.k
                      AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'running', b.from_id))
                OR EXISTS (
                    SELECT 1 FROM workflow_status a
                    WHERE a.queue = p_queue AND a.ordering_key = b.k
                      AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'scheduled', b.from_id)) AS busy
            FROM bounded b
        )
        SELECT coalesce(array_agg(t.k ORDER BY t.pos) FILTER (WHERE NOT t.busy), '{}'),
               coalesce(array_agg(t.pos ORDER BY t.pos) FILTER (WHERE NOT t.busy), '{}'),
               coalesce(array_agg(t.from_id ORDER BY t.pos) FILTER (WHERE NOT t.busy), '{}'),
               coalesce(array_agg(t.k) FILTER (WHERE t.busy), '{}'),
               coalesce(array_agg(t.from_id ORDER BY t.pos), '{}')
        INTO f_key, f_pos, f_from, blocked, l_from FROM checked t;

        -- The free keys' runs, read and locked key by key in dequeue
        -- order: each key's queued and waiting jobs in id order, each
        -- locked by its primary key, the run cut at its first job not
        -- locked here (another transaction holds it, or it is no longer
        -- queued or waiting). The reading stops once a claim's worth of
        -- jobs that can be taken was met (the outer LIMIT ends the nested
        -- loop): a claim that read and locked every met key's backlog
        -- cost twenty times what it took when each key had twenty jobs
        -- queued. The last run read may be cut by it; if the take reaches
        -- it, the key is held and its other queued jobs are parked below
        -- (the rest when a later claim meets them); if not, nothing of it
        -- changes. Each key's jobs are numbered and cut within its own
        -- read, whatever order the keys come in.
        WITH runs AS MATERIALIZED (
            SELECT f.k, f.pos, x.rn, x.tid
            FROM unnest(f_key, f_pos, f_from) AS f(k, pos, from_id) CROSS JOIN LATERAL (
                SELECT y.rn, y.tid FROM (
                    SELECT row_number() OVER run AS rn, l.tid,
                           count(*) FILTER (WHERE l.tid IS NULL) OVER run AS gaps
                    FROM (
                        SELECT v.shard_key, v.id FROM (
                            (SELECT w.shard_key, w.id FROM workflow_status w
                             WHERE w.queue = p_queue AND w.ordering_key = f.k
                               AND shardq_key_jobs_from(w.ordering_key, w.status, w.id, 'queued', f.from_id)
                             ORDER BY w.status, w.id LIMIT p_limit)
                            UNION ALL
                            (SELECT w.shard_key, w.id FROM workflow_status w
                             WHERE w.queue = p_queue AND w.ordering_key = f.k
                               AND shardq_key_jobs_from(w.ordering_key, w.status, w.id, 'waiting', f.from_id)
                             ORDER BY w.status, w.id LIMIT p_limit)) v
                        ORDER BY v.id LIMIT p_limit) u
                    LEFT JOIN LATERAL (
                        SELECT w.ctid AS tid FROM workflow_status w
                        WHERE w.shard_key = u.shard_key AND w.id = u.id
                          AND w.status IN ('queued', 'waiting')
                        FOR UPDATE SKIP LOCKED) l ON true
                    -- Row by row: a frame of peers would read (and lock)
                    -- one row ahead.
                    WINDOW run AS (ORDER BY u.id ROWS UNBOUNDED PRECEDING)) y
                WHERE y.gaps = 0) x
            LIMIT p_limit
        ), offered AS (
            SELECT t.tid, NULL::text AS k, t.pos, 0::bigint AS rn
            FROM unnest(c_tid, c_key) WITH ORDINALITY AS t(tid, k, pos)
            WHERE t.k IS NULL
            UNION ALL
            SELECT r.tid, r.k, r.pos, r.rn FROM runs r
        ), take AS (
            SELECT * FROM offered o ORDER BY o.pos, o.rn LIMIT p_limit
        )
        SELECT coalesce(array_agg(x.tid), '{}'),
               coalesce(array_agg(DISTINCT x.k) FILTER (WHERE x.k IS NOT NULL), '{}')
        INTO t_tid, held FROM take x;

        -- Taken before the keys are parked below: a row parked would move
        -- (a new tuple id) and the take would miss it. Got_slot 2 when
        -- fewer than asked while grouped jobs of the queue are ready (a
        -- queue of keys and groups: the next claim may take those).
        IF cardinality(t_tid) > 0 THEN
            RETURN QUERY SELECT * FROM shardq_take(t_tid, p_owner, p_lease_ms,
                CASE WHEN cardinality(t_tid) < p_limit
                          AND shardq_queue_has_ready(p_queue, p_plain => false,
                                                     p_keyed => false)
                     THEN 2 ELSE 1 END);
        END IF;

        -- Park the queued jobs of the keys held now: those this claim took,
        -- and the locked ones something else holds (bounded per claim).
        UPDATE workflow_status w SET status = 'waiting'
        FROM (
            SELECT q.shard_key, q.id FROM workflow_status q
            WHERE (q.shard_key, q.id) IN (
                SELECT n.shard_key, n.id FROM unnest(l_key, l_from) AS h(k, from_id)
                CROSS JOIN LATERAL (
                    SELECT w2.shard_key, w2.id FROM workflow_status w2
                    WHERE w2.queue = p_queue AND w2.ordering_key = h.k
                      AND shardq_key_jobs_from(w2.ordering_key, w2.status, w2.id, 'queued', h.from_id)
                    ORDER BY w2.status, w2.id LIMIT p_limit) n
                WHERE h.k = ANY (held || blocked)
                LIMIT 4 * p_limit)
              AND q.status = 'queued'
            FOR UPDATE SKIP LOCKED) p
        WHERE w.shard_key = p.shard_key AND w.id = p.id;
        GET DIAGNOSTICS parked = ROW_COUNT;

        EXIT WHEN cardinality(t_tid) > 0 OR parked = 0 OR round >= 4;
    END LOOP;
    IF cardinality(t_tid) = 0 THEN
        RETURN QUERY SELECT * FROM shardq_take('{}', p_owner, p_lease_ms,
            CASE WHEN shardq_queue_has_ready(p_queue, p_plain => false, p_keyed => false)
                 THEN 2 ELSE 1 END);
    END IF;
END $$;
