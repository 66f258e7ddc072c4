-- shardq_take: the take every claim path ends with (shardq_claim.sql says
-- what a claim does). The jobs at p_tids, locked by this transaction (so
-- their tuple ids cannot move before it ends: found with no index descent),
-- become running under p_owner: one more attempt, a new fence, a lease of
-- p_lease_ms, all started at one time: the clock when the take begins (the
-- lease ends p_lease_ms after it, later than the transaction id this
-- claim's row locks took, which the lease floor relies on: migration
-- 0051; one
-- `started_at` per claim is how `shardq check` tells a key's run, taken by
-- one claim, from a key running twice; the clock, not the transaction's
-- start: a grouped claim counts its groups' running jobs first, and a job
-- of the group that finished in between must count as finished before
-- this one started, in the rows as in the count).
--
-- Returns each job taken, with p_got_slot, in id order (the order a key's
-- jobs must run in); when none was taken, one row of p_got_slot and NULLs,
-- so the caller always learns its got_slot.
CREATE OR REPLACE FUNCTION shardq_take(p_tids tid[], p_owner text, p_lease_ms bigint,
                                       p_got_slot int)
RETURNS SETOF shardq_claimed
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    started timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY
    WITH taken AS (
        UPDATE workflow_status w SET status = 'running', owner = p_owner,
            attempts = w.attempts + 1, fence = w.fence + 1, started_at = started,
            lease_expires_at = started + p_lease_ms * interval '1 millisecond'
        WHERE w.ctid = ANY (p_tids)
        RETURNING w.shard_key, w.id, w.handler, w.ordering_key, w.priority, w.payload,
            w.attempts, w.fence, w.queue, w.created_at
    )
    SELECT p_got_slot, t.shard_key, t.id, t.handler, t.ordering_key, t.priority, t.payload,
           t.attempts, t.fence, t.queue, t.created_at
    FROM (SELECT 1) AS one LEFT JOIN taken t ON true
    ORDER BY t.id;
END $$;
