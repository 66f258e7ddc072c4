-- The newest row of each named group's start-rate bucket in `p_queue`
-- (migration 0050: a claim that takes from a group adds the bucket's row
-- and deletes the one it read), met first in a backward walk of the key
-- however many replaced ones a held horizon keeps. A group with no row has
-- a full bucket (none is returned for it). One call per grouped claim of a
-- queue with a group rate, for all the groups it met. plpgsql, so that it
-- applies to a schema older than its table; no bitmap or sequential scan,
-- which would read every row kept.
CREATE OR REPLACE FUNCTION shardq_group_buckets_of(p_queue text, p_groups text[])
RETURNS TABLE(job_group text, take_seq bigint, tokens double precision,
              tokens_at timestamptz)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT l.g, b.take_seq, b.tokens, b.tokens_at
    FROM unnest(p_groups) AS l(g)
    CROSS JOIN LATERAL (
        SELECT x.take_seq, x.tokens, x.tokens_at FROM shardq_group_buckets x
        WHERE x.queue = p_queue AND x.job_group = l.g
        ORDER BY x.take_seq DESC LIMIT 1) b;
END
$$;
