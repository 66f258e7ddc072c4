-- Takes up to `want` starts of `queue` from its rate's token bucket (home
-- shard): tokens come back at rate_count per rate_period_ms, up to a burst
-- of rate_count × 50 ms / period (at least 1), so any span of one period
-- holds at most rate_count plus that burst of starts. Returns the starts
-- taken, or NULL when the queue has no rate. A negative `want` gives
-- -want unused starts back. A take waits for half a burst (or `want`, if
-- fewer) to be there: at high rates claims then take tens of jobs, not a
-- few each (a claim costs the database about as much for 1 job as for
-- 50). Takes are under the limit row's lock; an ask that gets nothing is
-- answered from a plain read (no lock, no write: asks come often while a
-- queue waits for its rate).
--
-- The bucket is rows only added and deleted (migration 0048): a take adds
-- one numbered past the newest and deletes that one, and reads the newest
-- first in a backward walk of the key, so a held horizon, which keeps
-- every replaced row, does not lengthen the read; the limits row is only
-- locked (no version written). A queue with no bucket row yet starts from
-- the limits row's tokens and tokens_at (their state before 0048).
-- One plan per connection (force_generic_plan): it is asked several times
-- per claim of a rate-limited queue, and shardq's connections would plan
-- its statements anew on every call (most of its cost, pg_stat_statements).
-- No bitmap or sequential scan: with few live rows over the many pages a
-- hold keeps, the planner would take one, and it reads every row kept.
CREATE OR REPLACE FUNCTION shardq_take_starts(q text, want integer)
RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    lim shardq_queue_limits%ROWTYPE;
    locked boolean := false;
    b_seq bigint;
    b_tokens double precision;
    b_tokens_at timestamptz;
    burst double precision;
    left_tokens double precision;
    give integer;
    at timestamptz;
BEGIN
    LOOP
        IF locked THEN
            SELECT * INTO lim FROM shardq_queue_limits l WHERE l.queue = q FOR UPDATE;
        ELSE
            SELECT * INTO lim FROM shardq_queue_limits l WHERE l.queue = q;
        END IF;
        IF lim.rate_count IS NULL THEN
            RETURN NULL;
        END IF;
        -- Under the lock this reads the row the taker before left.
        SELECT b.take_seq, b.tokens, b.tokens_at INTO b_seq, b_tokens, b_tokens_at
            FROM shardq_rate_buckets b WHERE b.queue = q
            ORDER BY b.take_seq DESC LIMIT 1;
        IF b_seq IS NULL THEN
            b_tokens := lim.tokens;
            b_tokens_at := lim.tokens_at;
        END IF;
        -- Read once (under the lock when taking): two readings would lose
        -- the time between them on every call, and one taken before the
        -- lock could be older than the mark the previous holder left.
        at := clock_timestamp();
        burst := greatest(1.0, lim.rate_count * 50.0 / lim.rate_period_ms);
        -- Accrual is the same however often it is computed: a read that
        -- takes nothing need not write it.
        left_tokens := least(burst, b_tokens
            + extract(epoch FROM at - b_tokens_at) * 1000.0
              * lim.rate_count / lim.rate_period_ms);
        IF want >= 0 AND left_tokens < greatest(1.0, least(want, floor(burst / 2))) THEN
            RETURN 0;
        END IF;
        EXIT WHEN locked;
        locked := true;
    END LOOP;
    IF want < 0 THEN
        -- Taken and unused: back in full (past the burst too), so the
        -- starts used still never outrun the rate plus its burst.
        give := want;
        left_tokens := left_tokens - want;
    ELSE
        give := least(want, floor(left_tokens)::integer);
        left_tokens := left_tokens - give;
    END IF;
    INSERT INTO shardq_rate_buckets (queue, take_seq, tokens, tokens_at)
        VALUES (q, coalesce(b_seq, 0) + 1, left_tokens, at);
    IF b_seq IS NOT NULL THEN
        DELETE FROM shardq_rate_buckets b WHERE b.queue = q AND b.take_seq = b_seq;
    END IF;
    RETURN give;
END
$$;
