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
-- Returns shardq_claimed rows (migration 0030): one per claimed job in id
-- order, or one row with a NULL id: got_slot = 0 means every slot was busy;
-- 1 means a slot was taken; 2 that the claim took fewer than asked while
-- ready jobs were left that it could not take (held back by their groups'
-- or keys' rules, or locked by another claim). Every path ends with the
-- same take (shardq_take). The choice of path asks two probes on every
-- claim: shardq_queue_has_ready for keyed jobs only, and
-- shardq_grouped_ready_turn for grouped ones (which also leaves the
-- grouped walk without group limits its first turn). Unkeyed jobs are not
-- probed: shardq_lock_plain_ready locks them. A grouped or keyed claim
-- that took fewer than p_limit asks shardq_queue_has_ready again, leaving
-- out what it took, to choose got_slot 2.
--
-- Its statements are index walks whatever the parameters (their generic
-- plans are the custom ones, tests/plans.rs), so it keeps one plan per
-- connection (force_generic_plan) instead of planning every call, which was
-- most of the database's work per job under a moderate offer. Joins between
-- the statement's own small sets need hash joins, which shardq's connections
-- turn off for the big-table statements.
CREATE OR REPLACE FUNCTION shardq_claim(p_lock_class int, p_slots int, p_queue text,
                             p_limit int, p_owner text, p_lease_ms bigint)
RETURNS SETOF shardq_claimed
LANGUAGE plpgsql
SET enable_hashjoin = on
SET enable_mergejoin = on
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    keyed_ready boolean;
BEGIN
    -- A paused queue answers "empty" before any lock is tried: one probe of
    -- a table of a few rows per claim statement.
    IF EXISTS (SELECT 1 FROM shardq_paused_queues p WHERE p.queue = p_queue) THEN
        RETURN QUERY SELECT * FROM shardq_take('{}', p_owner, p_lease_ms, 1);
        RETURN;
    END IF;
    IF p_slots > 0 AND NOT EXISTS (
            SELECT 1 FROM generate_series(0, p_slots - 1) AS s
            WHERE pg_try_advisory_xact_lock(p_lock_class, s)) THEN
        RETURN QUERY SELECT * FROM shardq_take('{}', p_owner, p_lease_ms, 0);
        RETURN;
    END IF;
    keyed_ready := shardq_queue_has_ready(p_queue, p_plain => false, p_grouped => false);
    -- Grouped jobs ready: the groups take turns (shardq_claim_grouped, whose
    -- walk starts at the first ready turn found here). A queue that also
    -- has keyed jobs ready gives every other claim, at random, to its keyed
    -- jobs.
    IF shardq_grouped_ready_turn(p_queue) IS NOT NULL
       AND (random() < 0.5 OR NOT keyed_ready) THEN
        RETURN QUERY SELECT * FROM shardq_claim_grouped(p_queue, p_limit, p_owner, p_lease_ms);
    ELSIF keyed_ready THEN
        RETURN QUERY SELECT * FROM shardq_claim_keyed(p_queue, p_limit, p_owner, p_lease_ms);
    ELSE
        -- No keyed job ready: unkeyed jobs have no order to keep, so they
        -- are locked from their ready floors and taken.
        RETURN QUERY SELECT * FROM shardq_take(shardq_lock_plain_ready(p_queue, p_limit),
                                               p_owner, p_lease_ms, 1);
    END IF;
END $$;
