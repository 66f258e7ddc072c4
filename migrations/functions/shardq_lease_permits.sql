-- Sets the permits `holder` holds for each of `queues` to at most the
-- matching `wants`, within the queue's concurrency limit less the unexpired
-- permits of every other holder, for `lease_ms` from now. Per queue, the
-- limit row is locked first, so two holders' grants are counted one after
-- the other: the permits granted never add up to more than the limit. A
-- queue without a concurrency limit returns a NULL concurrency (and its
-- holder's lease is dropped). Each row says the queue's rate too, if any.
-- Expired leases of the queue are deleted on the way.
-- One plan per connection (force_generic_plan): its statements are
-- primary-key probes, and shardq's connections would plan them anew on
-- every call.
CREATE OR REPLACE FUNCTION shardq_lease_permits(holder text, queues text[], wants integer[], lease_ms integer)
RETURNS TABLE(queue text, concurrency integer, granted integer, rate_count integer, rate_period_ms integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    i integer;
    q text;
    lim shardq_queue_limits%ROWTYPE;
    others integer;
    give integer;
BEGIN
    FOR i IN 1 .. coalesce(array_length(queues, 1), 0) LOOP
        q := queues[i];
        lim := NULL;
        SELECT * INTO lim FROM shardq_queue_limits l WHERE l.queue = q FOR UPDATE;
        queue := q;
        rate_count := lim.rate_count;
        rate_period_ms := lim.rate_period_ms;
        concurrency := lim.concurrency;
        IF lim.concurrency IS NULL THEN
            DELETE FROM shardq_limit_leases e WHERE e.queue = q AND e.holder = shardq_lease_permits.holder;
            granted := wants[i];
            RETURN NEXT;
            CONTINUE;
        END IF;
        DELETE FROM shardq_limit_leases e WHERE e.queue = q AND e.expires_at <= now();
        SELECT coalesce(sum(e.permits), 0) INTO others FROM shardq_limit_leases e
            WHERE e.queue = q AND e.holder <> shardq_lease_permits.holder;
        give := greatest(0, least(wants[i], lim.concurrency - others));
        INSERT INTO shardq_limit_leases AS e (queue, holder, permits, expires_at)
            VALUES (q, shardq_lease_permits.holder, give, now() + lease_ms * interval '1 millisecond')
            ON CONFLICT ON CONSTRAINT shardq_limit_leases_pkey
            DO UPDATE SET permits = EXCLUDED.permits, expires_at = EXCLUDED.expires_at;
        granted := give;
        RETURN NEXT;
    END LOOP;
END
$$;
