-- shardq_claim_grouped: the claim of a queue with grouped jobs ready
-- (shardq_claim.sql says what a claim does and returns). Called by
-- shardq_claim, with the dequeue slot already taken.
--
-- Groups take turns. The claim finds up to p_limit groups with ready jobs,
-- in the order of their names' hashes from a random point of the hash
-- space, wrapping (shardq_group_heads: one index probe per group); the
-- queue's jobs without a group (and without a key) count as one more group,
-- at a random place among them. Of each group it locks (SKIP LOCKED) at
-- most ceil(p_limit / groups) jobs in (priority, id) order, then takes them
-- round by round: every group's first job, then every group's second, ...,
-- up to p_limit in all. So no group's backlog, however long, stands before
-- another group's jobs for more than its turn.
--
-- A queue's group limits (this shard's shardq_queue_limits row:
-- group_concurrency, group_rate_*) hold for each group on its own, exactly,
-- since a group's jobs without a key all live on one shard (they are placed
-- by their group). The group's lock is tried (another claim has it: the
-- group waits for a later claim); then a new statement, whose snapshot sees
-- every change made under that lock, counts the group's running jobs and
-- reads its token bucket (shardq_group_tokens: refilled at the rate, up to
-- a burst of the rate × 50 ms, at least 1). The claim takes no more of the
-- group than both allow, and writes back what it took from the bucket.
--
-- Between its statements, without the locks it holds, other transactions
-- may: enqueue jobs (a group found after the walk waits for the next
-- claim); claim jobs of groups this claim did not lock (without group
-- limits no group lock is taken; the rows themselves are locked before they
-- are taken, and a row another claim took is skipped); finish or give back
-- running jobs (the count falls, so the claim takes no more than allowed;
-- a job given back to 'queued' waits for a later claim); set the limits (a
-- claim uses the row it read first: a change counts from the next claim).
-- A job that still runs after its lease expired and was given back counts
-- no more, so its group may then run one job over its concurrency.
CREATE OR REPLACE FUNCTION shardq_claim_grouped(p_queue text, p_limit int,
                                                p_owner text, p_lease_ms bigint)
RETURNS TABLE (got_slot int, shard_key int, id bigint, handler text,
               ordering_key text, priority int, payload jsonb, attempts int,
               fence bigint, queue text, created_at timestamptz)
LANGUAGE plpgsql
SET enable_hashjoin = on
SET enable_mergejoin = on
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    lim shardq_queue_limits%ROWTYPE;
    limited boolean;
    held_back boolean;
    start int := (floor(random() * 4294967296) - 2147483648)::int;
    heads int[];
    head_tids tid[];
    more_heads int[];
    more_tids tid[];
    has_plain boolean;
    plain_pos float8;
    per_group int;
    c_tid tid[]; c_sk int[]; c_id bigint[]; c_group text[]; c_pos float8[]; c_rn bigint[];
    l_group text[];                           -- groups whose lock this claim got
    a_group text[]; a_allowed int[]; a_tokens float8[];
    t_tid tid[]; t_sk int[]; t_id bigint[];
    at timestamptz;
BEGIN
    SELECT * INTO lim FROM shardq_queue_limits l WHERE l.queue = p_queue;
    limited := lim.group_concurrency IS NOT NULL OR lim.group_rate_count IS NOT NULL;

    SELECT g.hashes, g.heads INTO heads, head_tids
        FROM shardq_group_heads(p_queue, start, 2147483648, p_limit) g;
    IF cardinality(heads) < p_limit THEN
        SELECT g.hashes, g.heads INTO more_heads, more_tids
            FROM shardq_group_heads(p_queue, -2147483648, start, p_limit - cardinality(heads)) g;
        heads := heads || more_heads;
        head_tids := head_tids || more_tids;
    END IF;
    has_plain := EXISTS (SELECT 1 FROM workflow_status w
                         WHERE w.queue = p_queue AND w.status = 'queued'
                           AND w.ordering_key IS NULL AND w.job_group IS NULL);
    per_group := ceil(p_limit::numeric / greatest(1, cardinality(heads) + has_plain::int));
    plain_pos := random() * (cardinality(heads) + 1) + 0.5;

    -- One job of each group: the heads the walk found, by tuple id (taken
    -- or changed since: the lock finds the row's newest version and its
    -- status no longer matches; the outer statement's snapshot keeps every
    -- version it might meet from being removed). More: each group's first
    -- per_group jobs.
    WITH heads_only AS MATERIALIZED (
        SELECT g.pos::float8 AS pos, w.ctid AS tid, w.shard_key, w.id, w.job_group, w.priority
        FROM unnest(head_tids) WITH ORDINALITY AS g(tid, pos)
        JOIN workflow_status w ON w.ctid = g.tid
        WHERE per_group = 1 AND w.status = 'queued' AND w.queue = p_queue
          AND w.job_group IS NOT NULL
        FOR UPDATE OF w SKIP LOCKED
    ), runs AS MATERIALIZED (
        SELECT g.pos::float8 AS pos, c.tid, c.shard_key, c.id, c.job_group, c.priority
        FROM unnest(heads) WITH ORDINALITY AS g(h, pos) CROSS JOIN LATERAL (
            SELECT w.ctid AS tid, w.shard_key, w.id, w.job_group, w.priority
            FROM workflow_status w
            WHERE per_group > 1 AND w.queue = p_queue AND w.status = 'queued'
              AND w.job_group IS NOT NULL AND hashtext(w.job_group) = g.h
            ORDER BY w.priority, w.id LIMIT per_group FOR UPDATE SKIP LOCKED) c
    ), grouped AS (
        SELECT * FROM heads_only UNION ALL SELECT * FROM runs
    ), plain AS MATERIALIZED (
        SELECT w.ctid AS tid, w.shard_key, w.id, w.priority FROM workflow_status w
        WHERE has_plain AND w.queue = p_queue AND w.status = 'queued'
          AND w.ordering_key IS NULL AND w.job_group IS NULL
        ORDER BY w.priority, w.id LIMIT per_group FOR UPDATE SKIP LOCKED
    ), met AS (
        SELECT g.pos, g.tid, g.shard_key, g.id, g.job_group,
               row_number() OVER (PARTITION BY g.pos ORDER BY g.priority, g.id) AS rn
        FROM grouped g
        UNION ALL
        SELECT plain_pos, p.tid, p.shard_key, p.id, NULL,
               row_number() OVER (ORDER BY p.priority, p.id) FROM plain p
    )
    SELECT coalesce(array_agg(m.tid), '{}'), coalesce(array_agg(m.shard_key), '{}'),
           coalesce(array_agg(m.id), '{}'), coalesce(array_agg(m.job_group), '{}'),
           coalesce(array_agg(m.pos), '{}'), coalesce(array_agg(m.rn), '{}')
    INTO c_tid, c_sk, c_id, c_group, c_pos, c_rn FROM met m;

    IF limited THEN
        -- Try each group's lock once (a volatile condition stays above the
        -- DISTINCT, so it runs once per group).
        SELECT coalesce(array_agg(d.g), '{}') INTO l_group
        FROM (SELECT DISTINCT g FROM unnest(c_group) AS g WHERE g IS NOT NULL) d
        WHERE pg_try_advisory_xact_lock(shardq_key_lock(p_queue, chr(30) || d.g));

        -- A new statement: its snapshot sees all that was done under the group locks.
        at := clock_timestamp();
        SELECT coalesce(array_agg(a.g), '{}'), coalesce(array_agg(a.allowed), '{}'),
               coalesce(array_agg(a.tokens), '{}')
        INTO a_group, a_allowed, a_tokens FROM (
            SELECT l.g, t.tokens, least(
                CASE WHEN lim.group_concurrency IS NULL THEN p_limit
                     ELSE greatest(0, lim.group_concurrency - (
                         SELECT count(*) FROM workflow_status r
                         WHERE r.queue = p_queue AND r.job_group = l.g
                           AND r.status = 'running'))::int END,
                CASE WHEN lim.group_rate_count IS NULL THEN p_limit
                     ELSE floor(t.tokens)::int END) AS allowed
            FROM unnest(l_group) AS l(g)
            CROSS JOIN LATERAL (
                SELECT least(greatest(1.0, lim.group_rate_count * 50.0 / lim.group_rate_period_ms),
                             coalesce(b.tokens + extract(epoch FROM at - b.tokens_at) * 1000.0
                                      * lim.group_rate_count / lim.group_rate_period_ms,
                                      greatest(1.0, lim.group_rate_count * 50.0
                                                    / lim.group_rate_period_ms))) AS tokens
                FROM (SELECT 1) AS one
                LEFT JOIN shardq_group_tokens b ON b.queue = p_queue AND b.job_group = l.g) t
        ) a;

        SELECT coalesce(array_agg(x.tid), '{}'), coalesce(array_agg(x.shard_key), '{}'),
               coalesce(array_agg(x.id), '{}')
        INTO t_tid, t_sk, t_id FROM (
            SELECT c.tid, c.shard_key, c.id FROM unnest(c_tid, c_sk, c_id, c_group, c_pos, c_rn)
                AS c(tid, shard_key, id, g, pos, rn)
            LEFT JOIN unnest(a_group, a_allowed) AS a(g, allowed) ON a.g = c.g
            WHERE c.g IS NULL OR c.rn <= a.allowed
            ORDER BY c.rn, c.pos LIMIT p_limit) x;

        IF lim.group_rate_count IS NOT NULL THEN
            INSERT INTO shardq_group_tokens AS b (queue, job_group, tokens, tokens_at)
            SELECT p_queue, a.g, a.tokens - n.taken, at
            FROM unnest(a_group, a_tokens) AS a(g, tokens)
            JOIN (SELECT w.job_group, count(*) AS taken FROM workflow_status w
                  JOIN unnest(t_sk, t_id) AS t(shard_key, id)
                    ON w.shard_key = t.shard_key AND w.id = t.id
                  GROUP BY w.job_group) n ON n.job_group = a.g
            ON CONFLICT (queue, job_group) DO UPDATE
                SET tokens = EXCLUDED.tokens, tokens_at = EXCLUDED.tokens_at;
        END IF;
    ELSE
        SELECT coalesce(array_agg(x.tid), '{}'), coalesce(array_agg(x.shard_key), '{}'),
               coalesce(array_agg(x.id), '{}')
        INTO t_tid, t_sk, t_id FROM (
            SELECT c.tid, c.shard_key, c.id FROM unnest(c_tid, c_sk, c_id, c_pos, c_rn)
                AS c(tid, shard_key, id, pos, rn)
            ORDER BY c.rn, c.pos LIMIT p_limit) x;
    END IF;

    -- Found by tuple id: a row this transaction locked cannot move before
    -- it ends. started_at: the clock now, after the count, not the
    -- transaction's start: a job of the group finished between the two
    -- counts as finished before this one started, in the rows as in the
    -- count.
    UPDATE workflow_status w SET status = 'running', owner = p_owner,
        attempts = w.attempts + 1, fence = w.fence + 1, started_at = clock_timestamp(),
        lease_expires_at = now() + p_lease_ms * interval '1 millisecond'
    WHERE w.ctid = ANY (t_tid);

    -- A claim that took fewer than asked while grouped jobs stay ready
    -- (held back here by limits, or heads locked by a concurrent claim
    -- that takes one job of each group it meets) says so: got_slot 2, and
    -- the worker asks again soon, as after an empty claim, instead of
    -- taking the queue for caught up and waiting for a wake-up.
    held_back := cardinality(t_id) < p_limit AND EXISTS (
        SELECT 1 FROM workflow_status w
        WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL);

    -- The rows as this transaction left them (one primary-key probe each).
    RETURN QUERY
    SELECT CASE WHEN held_back THEN 2 ELSE 1 END,
           w.shard_key, w.id, w.handler, w.ordering_key, w.priority, w.payload,
           w.attempts, w.fence, w.queue, w.created_at
    FROM (SELECT 1) AS one
    LEFT JOIN (unnest(t_sk, t_id) AS t(shard_key, id)
               JOIN workflow_status w ON w.shard_key = t.shard_key AND w.id = t.id) ON true
    ORDER BY w.id;
END $$;
