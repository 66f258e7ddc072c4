-- Sets the permits `holder` holds for each of `queues` to at most the
-- matching `wants`, within the queue's concurrency limit less the unexpired
-- permits of every other holder, for `lease_ms` from now. Per queue, the
-- limit row is locked first, so two holders' grants are counted one after
-- the other: the permits granted never add up to more than the limit. A
-- queue without a concurrency limit returns a NULL concurrency (and its
-- holder's lease is dropped). Each row says the queue's rate too, if any.
-- Lapsed leases of the queue, and their holders, are deleted on the way.
--
-- A lease is rows only added and deleted (migration 0048): each holder of
-- a queue has a row in shardq_limit_holders (written once), and each
-- renewal adds the holder's lease row, numbered from a sequence (past
-- every row it had, those of a lease that lapsed too), and deletes the
-- one it replaces, so each read of a holder's lease meets its newest row
-- first in a backward walk of the key, however many replaced ones a held
-- horizon keeps (one row updated by every renewal, every 500 ms by every
-- process, made each renewal walk every version of every holder's row).
-- One plan per connection (force_generic_plan): its statements are
-- key probes, and shardq's connections would plan them anew on every
-- call. No bitmap or sequential scan: with few live rows over the many
-- pages a hold keeps, the planner would take one, and it reads them all.
CREATE OR REPLACE FUNCTION shardq_lease_permits(holder text, queues text[], wants integer[], lease_ms integer)
RETURNS TABLE(queue text, concurrency integer, granted integer, rate_count integer, rate_period_ms integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    i integer;
    q text;
    lim shardq_queue_limits%ROWTYPE;
    other record;
    own_known boolean;
    own_seq bigint;
    l_seq bigint;
    l_permits integer;
    l_expires timestamptz;
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
        -- Every holder's newest lease row; lapsed ones go with their holder.
        others := 0;
        own_known := false;
        own_seq := NULL;
        FOR other IN SELECT h.holder FROM shardq_limit_holders h WHERE h.queue = q LOOP
            SELECT e.renewal_seq, e.permits, e.expires_at INTO l_seq, l_permits, l_expires
                FROM shardq_limit_lease_moves e
                WHERE e.queue = q AND e.holder = other.holder
                ORDER BY e.renewal_seq DESC LIMIT 1;
            IF other.holder = shardq_lease_permits.holder AND lim.concurrency IS NOT NULL THEN
                own_known := true;
                own_seq := l_seq;
            ELSIF other.holder = shardq_lease_permits.holder OR l_seq IS NULL
                  OR l_expires <= now() THEN
                DELETE FROM shardq_limit_lease_moves e
                    WHERE e.queue = q AND e.holder = other.holder AND e.renewal_seq = l_seq;
                DELETE FROM shardq_limit_holders h
                    WHERE h.queue = q AND h.holder = other.holder;
            ELSE
                others := others + l_permits;
            END IF;
        END LOOP;
        IF lim.concurrency IS NULL THEN
            granted := wants[i];
            RETURN NEXT;
            CONTINUE;
        END IF;
        give := greatest(0, least(wants[i], lim.concurrency - others));
        IF NOT own_known THEN
            INSERT INTO shardq_limit_holders (queue, holder)
                VALUES (q, shardq_lease_permits.holder);
        END IF;
        INSERT INTO shardq_limit_lease_moves (queue, holder, renewal_seq, permits, expires_at)
            VALUES (q, shardq_lease_permits.holder, nextval('shardq_limit_lease_seq'), give,
                    now() + lease_ms * interval '1 millisecond');
        IF own_seq IS NOT NULL THEN
            DELETE FROM shardq_limit_lease_moves e
                WHERE e.queue = q AND e.holder = shardq_lease_permits.holder
                  AND e.renewal_seq = own_seq;
        END IF;
        granted := give;
        RETURN NEXT;
    END LOOP;
END
$$;
