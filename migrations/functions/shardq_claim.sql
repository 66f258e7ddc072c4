-- shardq_claim: the claim, in one round trip. Tries dequeue slots
-- 0..p_slots-1 (none when p_slots = 0: ungated) and stops at the first it
-- gets; then claims up to p_limit ready jobs of p_queue for p_owner with a
-- lease of p_lease_ms.
--
-- A paused queue (a row in shardq_paused_queues) answers "empty" at once.
-- A queue with grouped jobs ready goes through shardq_claim_grouped.
-- Unkeyed ready jobs are locked with SKIP LOCKED from their ready floors
-- (shardq_lock_plain_ready: a claim does not walk the versions of what was
-- claimed before, however long a transaction holds vacuum back) and, when
-- the queue has no keyed job ready, updated by tuple id (a row this
-- transaction locked cannot move before it ends, so its ctid finds it with
-- no second index descent). A queue with keyed jobs ready goes through
-- shardq_claim_keyed, which reads keyed ready jobs (key heads) apart, so
-- blocked keyed jobs never take an unkeyed job's place.
--
-- Returns one row per claimed job in id order, or one row with a NULL id:
-- got_slot = 0 means every slot was busy; 1 means a slot was taken; 2
-- that some ready jobs were held back by their groups' limits.
--
-- Its statements are index walks whatever the parameters (their generic
-- plans are the custom ones, tests/plans.rs), so it keeps one plan per
-- connection (force_generic_plan) instead of planning every call, which was
-- most of the database's work per job under a moderate offer. Joins between
-- the statement's own small sets need hash joins, which shardq's connections
-- turn off for the big-table statements.
CREATE OR REPLACE FUNCTION shardq_claim(p_lock_class int, p_slots int, p_queue text,
                             p_limit int, p_owner text, p_lease_ms bigint)
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
    tids tid[];
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
    -- Grouped jobs ready: the groups take turns (shardq_claim_grouped). A
    -- queue that also has keyed jobs ready gives every other claim, at
    -- random, to its keyed jobs.
    IF EXISTS (SELECT 1 FROM workflow_status w
               WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL)
       AND (random() < 0.5 OR NOT EXISTS (SELECT 1 FROM workflow_status w
               WHERE w.queue = p_queue AND w.status = 'queued'
                 AND w.ordering_key IS NOT NULL)) THEN
        RETURN QUERY SELECT * FROM shardq_claim_grouped(p_queue, p_limit, p_owner, p_lease_ms);
        RETURN;
    END IF;
    -- No keyed job ready: unkeyed jobs have no order to keep, so they are
    -- locked (from their ready floors: shardq_lock_plain_ready) and claimed
    -- by tuple id, each row probed once.
    IF NOT EXISTS (SELECT 1 FROM workflow_status w
                   WHERE w.queue = p_queue AND w.status = 'queued'
                     AND w.ordering_key IS NOT NULL) THEN
        tids := shardq_lock_plain_ready(p_queue, p_limit);
        RETURN QUERY
        WITH claimed AS (
            UPDATE workflow_status w SET status = 'running', owner = p_owner,
                attempts = w.attempts + 1, fence = w.fence + 1, started_at = now(),
                lease_expires_at = now() + p_lease_ms * interval '1 millisecond'
            WHERE w.ctid = ANY (tids)
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
