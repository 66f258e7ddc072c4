-- shardq_claim_grouped: the claim of a queue with grouped jobs ready
-- (shardq_claim.sql says what a claim does and returns). Called by
-- shardq_claim, with the dequeue slot already taken.
--
-- Groups take turns. Without group limits, the claim locks (SKIP LOCKED) up
-- to p_limit grouped jobs in (turn, priority, id) order, one walk of
-- workflow_status_ready_grouped: every group's first turn, then every
-- group's second, and so on (shardq_take_turn numbers the turns as jobs
-- become ready, from the queue's round), from the queue's grouped floor
-- (shardq_move_group_rounds moves both with the ready floors, at most
-- every 250 ms), or from the first ready turn the claim's choice of path
-- found past it (shardq_grouped_ready_turn): what was claimed before lies
-- behind it, however long the horizon is held. The queue's jobs without a group (and without a key)
-- count as one more group: they get p_limit / (groups met + 1) of the
-- claim (rounded at random, in proportion), or what the groups leave, and
-- the grouped jobs the rest.
--
-- With group limits, the claim finds up to p_limit groups with ready jobs,
-- in the order of their names' hashes from a random point of the hash
-- space, wrapping (shardq_group_heads: one index probe per group); the
-- queue's jobs without a group (and without a key) count as one more group,
-- at a random place among them. Of each group it locks (SKIP LOCKED) at
-- most ceil(p_limit / groups) jobs in (priority, turn, id) order (the
-- order they became ready, from the group's line in
-- workflow_status_group_lines, at or past the queue's grouped floor: the
-- jobs claimed before it are passed in the index), then takes them
-- round by round: every group's first job, then every group's second, ...,
-- up to p_limit in all. So no group's backlog, however long, stands before
-- another group's jobs for more than its turn.
--
-- A queue's group limits (this shard's shardq_queue_limits row:
-- group_concurrency, group_rate_*) hold for each group on its own, exactly,
-- since a group's jobs all live on one shard (they are placed by their
-- group). Before any row is locked, each group's lock is tried (another
-- claim has it: the group waits for a later claim); then new statements,
-- whose snapshots see every change made under those locks, count each
-- group's running jobs and read its token bucket (with a group rate:
-- shardq_group_buckets_of, the newest row of each; refilled at the rate,
-- up to a burst of the rate × 50 ms, at least 1; a group with no row has
-- a full bucket).
-- Groups that may start nothing now are left out, so their share goes to
-- the others; no group gets more rows than both limits allow, and what it
-- took comes off its bucket (shardq_group_buckets_write: a row added, the
-- one read deleted; migration 0050, so a held horizon does not lengthen
-- the next claim's read or write).
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
-- Another claim may move the grouped floor after the heads' walk or the
-- runs read it: what they read stays a bound (a job made ready after a
-- move gets a turn past the round, at or past the floor).
-- Without limits, between the floor's read and the walk, and the walk and
-- the take: other claims take other rows (the walk's are locked); a
-- producer commits a job numbered from a round read before a move (its
-- turn is not below the floor: the floor passes a round only once such
-- producers have ended); another claim moves the floor (up to a ready turn
-- no lower than any this walk may miss).
CREATE OR REPLACE FUNCTION shardq_claim_grouped(p_queue text, p_limit int,
                                                p_owner text, p_lease_ms bigint)
RETURNS SETOF shardq_claimed
LANGUAGE plpgsql
SET enable_hashjoin = on
SET enable_mergejoin = on
SET enable_bitmapscan = off
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    lim shardq_queue_limits%ROWTYPE;
    limited boolean;
    held_back boolean;
    start int := (floor(random() * 4294967296) - 2147483648)::int;
    g_name text[]; g_tid tid[];               -- groups met, and their heads
    more_name text[]; more_tid tid[];
    g_allowed int[];                          -- jobs each may start now (limited)
    a_name text[]; a_allowed int[]; a_tokens float8[]; a_seq bigint[];
    b_name text[]; b_seq bigint[]; b_tokens float8[]; b_at timestamptz[];
    has_plain boolean;
    plain_tids tid[];        -- ready jobs without a group, locked here
    plain_pos float8;
    per_group int;
    c_tid tid[]; c_sk int[]; c_id bigint[]; c_group text[]; c_pos float8[]; c_rn bigint[];
    t_tid tid[]; t_group text[];
    at timestamptz;
    walk_from bigint;                         -- without limits: where the walk starts
    line_from bigint;                         -- with limits: where each group's run starts
    groups_met bigint;                        -- and the groups it met
    plain_share float8;                       -- the ungrouped jobs' share
BEGIN
    SELECT * INTO lim FROM shardq_queue_limits l WHERE l.queue = p_queue;
    limited := lim.group_concurrency IS NOT NULL OR lim.group_rate_count IS NOT NULL;

    IF NOT limited THEN
        -- The floors and rounds move before any job is locked (the move
        -- needs a transaction without an id yet).
        PERFORM shardq_advance_ready_floors();
        walk_from := shardq_group_floor(p_queue);
        -- Past the floor: the first ready turn the claim's choice of path
        -- found in this transaction (shardq_grouped_ready_turn), read once.
        IF current_setting('shardq.grouped_from_queue', true) = p_queue AND p_queue <> '' THEN
            walk_from := greatest(walk_from, nullif(
                current_setting('shardq.grouped_from_turn', true), '')::bigint);
        END IF;
        PERFORM set_config('shardq.grouped_from_queue', '', true);
        SELECT coalesce(array_agg(t.tid ORDER BY t.turn, t.priority, t.id), '{}'),
               count(DISTINCT t.job_group)
        INTO g_tid, groups_met
        FROM (SELECT w.ctid AS tid, w.job_group, w.turn, w.priority, w.id
              FROM workflow_status w
              WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL
                AND w.turn >= walk_from
              ORDER BY w.turn, w.priority, w.id LIMIT p_limit
              FOR UPDATE SKIP LOCKED) t;
        -- Their share, p_limit / (groups + 1), rounded up or down at random
        -- in proportion (a claim of 1 with one group met: half the time).
        plain_share := p_limit::float8 / (groups_met + 1);
        plain_tids := shardq_lock_plain_ready(p_queue, greatest(
            floor(plain_share)::int + (random() < plain_share - floor(plain_share))::int,
            p_limit - cardinality(g_tid)));
        t_tid := g_tid[1:p_limit - cardinality(plain_tids)] || plain_tids;
        -- Fewer than asked: the walk reached the end of the numbered
        -- grouped jobs it could see, and locked every one no other
        -- transaction held, so only the other kinds and grouped jobs
        -- without a turn are probed (probing the grouped index again would
        -- walk its dead entries twice under a held horizon). As for jobs
        -- without a group, a grouped job committed after the walk announces
        -- itself, and one a transaction held and let go waits for the next
        -- claim of the queue.
        held_back := cardinality(t_tid) < p_limit
            AND (shardq_queue_has_ready(p_queue, p_grouped => false, p_taking => t_tid)
                 OR EXISTS (SELECT 1 FROM workflow_status w
                            WHERE w.queue = p_queue AND w.status = 'queued'
                              AND w.job_group IS NOT NULL AND w.turn IS NULL));
        RETURN QUERY SELECT * FROM shardq_take(t_tid, p_owner, p_lease_ms,
                                               CASE WHEN held_back THEN 2 ELSE 1 END);
        RETURN;
    END IF;

    SELECT g.names, g.heads INTO g_name, g_tid
        FROM shardq_group_heads(p_queue, start, 2147483648, p_limit) g;
    IF cardinality(g_name) < p_limit THEN
        SELECT g.names, g.heads INTO more_name, more_tid
            FROM shardq_group_heads(p_queue, -2147483648, start, p_limit - cardinality(g_name)) g;
        g_name := g_name || more_name;
        g_tid := g_tid || more_tid;
    END IF;

    -- Group limits: each group's lock, tried once (the walk met each name once).
    SELECT coalesce(array_agg(l.g), '{}') INTO a_name
    FROM unnest(g_name) AS l(g)
    WHERE pg_try_advisory_xact_lock(shardq_key_lock(p_queue, chr(30) || l.g));
    -- New statements: their snapshots see all that was done under the
    -- group locks. Buckets only with a group rate (a queue without one
    -- reads none); each refilled at the rate up to its burst.
    IF lim.group_rate_count IS NOT NULL THEN
        SELECT array_agg(b.job_group), array_agg(b.take_seq), array_agg(b.tokens),
               array_agg(b.tokens_at)
        INTO b_name, b_seq, b_tokens, b_at
        FROM shardq_group_buckets_of(p_queue, a_name) b;
    END IF;
    at := clock_timestamp();
    SELECT coalesce(array_agg(a.g), '{}'), coalesce(array_agg(a.allowed), '{}'),
           coalesce(array_agg(a.tokens), '{}'), coalesce(array_agg(a.seq), '{}')
    INTO a_name, a_allowed, a_tokens, a_seq FROM (
        SELECT l.g, t.tokens, t.seq, least(p_limit,
            CASE WHEN lim.group_concurrency IS NULL THEN p_limit
                 ELSE greatest(0, lim.group_concurrency - (
                     SELECT count(*) FROM workflow_status r
                     WHERE r.queue = p_queue AND r.job_group = l.g
                       AND r.status = 'running')) END,
            CASE WHEN lim.group_rate_count IS NULL THEN p_limit
                 ELSE floor(t.tokens) END)::int AS allowed
        FROM unnest(a_name) AS l(g)
        CROSS JOIN LATERAL (
            SELECT least(greatest(1.0, lim.group_rate_count * 50.0 / lim.group_rate_period_ms),
                         coalesce(b.tokens + extract(epoch FROM at - b.tokens_at) * 1000.0
                                  * lim.group_rate_count / lim.group_rate_period_ms,
                                  greatest(1.0, lim.group_rate_count * 50.0
                                                / lim.group_rate_period_ms))) AS tokens,
                   b.seq
            FROM (SELECT 1) AS one
            LEFT JOIN unnest(b_name, b_seq, b_tokens, b_at) AS b(g, seq, tokens, tokens_at)
                ON b.g = l.g) t
    ) a;
    -- Only the groups that may start something now, in walk order.
    SELECT coalesce(array_agg(w.g ORDER BY w.pos), '{}'),
           coalesce(array_agg(w.head ORDER BY w.pos), '{}'),
           coalesce(array_agg(a.allowed ORDER BY w.pos), '{}')
    INTO g_name, g_tid, g_allowed
    FROM unnest(g_name, g_tid) WITH ORDINALITY AS w(g, head, pos)
    JOIN unnest(a_name, a_allowed) AS a(g, allowed) ON a.g = w.g
    WHERE a.allowed > 0;

    plain_tids := shardq_lock_plain_ready(p_queue, p_limit);
    -- The queue's rounds row (made by its first claim): the moves of the
    -- rounds number the grouped jobs left without a turn only in queues
    -- that have one. Its floor bounds the runs below (no ready job's turn
    -- is under it), as it bounds the heads' walk.
    line_from := shardq_group_floor(p_queue);
    has_plain := cardinality(plain_tids) > 0;
    per_group := ceil(p_limit::numeric / greatest(1, cardinality(g_name) + has_plain::int));
    plain_pos := random() * (cardinality(g_name) + 1) + 0.5;

    -- One job of each group: the heads the walk found, locked by tuple id
    -- (the outer statement's snapshot keeps every version it might meet
    -- from being removed), then checked: a head taken or changed since is
    -- left (the lock returns the row's newest version, taken: no longer
    -- queued; changed and still queued: a new tuple id, not among the
    -- heads). Only the ids bound the scan (OFFSET 0 keeps the checks out
    -- of it): with them in it, the plan the connection keeps (made with
    -- the statistics of a small queue) walked every ready job of the queue
    -- instead, 14-28 ms a claim with 20,000 ready until autovacuum's next
    -- analyze. No sequential scan (as on shardq's own connections): a plan
    -- made while the table had a few pages would keep one; no bitmap scan
    -- either: a group's run read as one reads every ready job of the group
    -- and sorts them, where an index scan stops at the run's length. More: each
    -- group's first per_group jobs, no more than it may start. The jobs
    -- without a group fill what the groups leave, after their turn.
    WITH heads_only AS MATERIALIZED (
        SELECT h.pos::float8 AS pos, h.tid, h.shard_key, h.id, h.job_group, h.priority, h.turn
        FROM (SELECT w.ctid AS tid, w.shard_key, w.id, w.job_group, w.priority, w.turn,
                     w.status, w.queue, array_position(g_tid, w.ctid) AS pos
              FROM workflow_status w
              WHERE per_group = 1 AND w.ctid = ANY (g_tid)
              FOR UPDATE OF w SKIP LOCKED OFFSET 0) h
        WHERE h.pos IS NOT NULL AND h.status = 'queued' AND h.queue = p_queue
          AND h.job_group IS NOT NULL
    ), runs AS MATERIALIZED (
        SELECT g.pos::float8 AS pos, c.tid, c.shard_key, c.id, c.job_group, c.priority, c.turn
        FROM unnest(g_name, coalesce(g_allowed, '{}')) WITH ORDINALITY AS g(name, allowed, pos)
        CROSS JOIN LATERAL (
            SELECT w.ctid AS tid, w.shard_key, w.id, w.job_group, w.priority, w.turn
            FROM workflow_status w
            WHERE per_group > 1 AND w.queue = p_queue
              AND w.status >= 'queued' AND w.status <= 'queued'
              AND w.job_group IS NOT NULL AND hashtext(w.job_group) = hashtext(g.name)
              AND w.job_group = g.name AND w.turn >= line_from
            ORDER BY w.priority, w.turn, w.id
            LIMIT least(per_group, coalesce(g.allowed, per_group))
            FOR UPDATE SKIP LOCKED) c
    ), plain AS MATERIALIZED (
        SELECT w.ctid AS tid, w.shard_key, w.id, w.priority FROM workflow_status w
        WHERE w.ctid = ANY (plain_tids)
    ), met AS (
        SELECT g.pos, g.tid, g.shard_key, g.id, g.job_group,
               row_number() OVER (PARTITION BY g.pos ORDER BY g.priority, g.turn, g.id) AS rn
        FROM (SELECT * FROM heads_only UNION ALL SELECT * FROM runs) g
        UNION ALL
        SELECT plain_pos, p.tid, p.shard_key, p.id, NULL,
               row_number() OVER (ORDER BY p.priority, p.id) FROM plain p
    )
    SELECT coalesce(array_agg(m.tid), '{}'), coalesce(array_agg(m.job_group), '{}')
    INTO t_tid, t_group FROM (SELECT * FROM met ORDER BY rn, pos LIMIT p_limit) m;

    IF lim.group_rate_count IS NOT NULL THEN
        -- What each group took comes off its bucket (groups that took
        -- nothing keep theirs: its refill needs no write): a new row each,
        -- the one read deleted.
        PERFORM shardq_group_buckets_write(p_queue, array_agg(a.g), array_agg(a.seq),
                                           array_agg(a.tokens - n.taken), at)
        FROM unnest(a_name, a_tokens, a_seq) AS a(g, tokens, seq)
        JOIN (SELECT t.g, count(*) AS taken FROM unnest(t_group) AS t(g)
              WHERE t.g IS NOT NULL GROUP BY t.g) n ON n.g = a.g
        HAVING count(*) > 0;
    END IF;

    -- Fewer than asked while jobs of the queue stay ready besides those
    -- taken now (held back by limits, heads a concurrent claim had, or
    -- keyed jobs this path does not take): got_slot 2, so the worker asks
    -- again soon instead of taking the queue for caught up and waiting for
    -- a wake-up. (A new statement: its snapshot sees what other claims
    -- took while this one ran.)
    held_back := cardinality(t_tid) < p_limit
        AND shardq_queue_has_ready(p_queue, p_taking => t_tid);

    RETURN QUERY SELECT * FROM shardq_take(t_tid, p_owner, p_lease_ms,
                                           CASE WHEN held_back THEN 2 ELSE 1 END);
END $$;
