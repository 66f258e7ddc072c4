-- Per queue, the permits of unexpired leases and how many holders hold
-- some (`shardq limit list`, the exporter's shardq_queue_limit_* gauges):
-- each holder's newest lease row (migration 0048: a renewal adds a row
-- and deletes the one it replaces), met first in a backward walk of the
-- key however many replaced ones a held horizon keeps. plpgsql, so that
-- it applies to a schema older than its tables; no bitmap or sequential
-- scan, which would read every row kept.
CREATE OR REPLACE FUNCTION shardq_permits_in_use()
RETURNS TABLE(queue text, permits bigint, holders bigint)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT h.queue, coalesce(sum(e.permits), 0)::int8,
           count(*) FILTER (WHERE e.permits > 0)
    FROM shardq_limit_holders h
    CROSS JOIN LATERAL (
        SELECT m.permits, m.expires_at FROM shardq_limit_lease_moves m
        WHERE m.queue = h.queue AND m.holder = h.holder
        ORDER BY m.renewal_seq DESC LIMIT 1) e
    WHERE e.expires_at > now()
    GROUP BY h.queue;
END
$$;
