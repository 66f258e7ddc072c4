-- shardq_complete_many: writes many outcomes in one call, fenced: a row
-- changes only while it is still running under this owner (p_owner) and this
-- claim's fence (p_fences). Each row's asked status (p_statuses) is
-- `succeeded`, `failed`, `dead`, `released` or `parked`.
--
-- A failure with attempts left becomes `scheduled` again after an
-- exponential, jittered backoff (p_backoff_min_ms doubling per attempt, at
-- most p_backoff_max_ms; the exponent stops at 62, so no attempt count
-- overflows float8: 2^62 times any backoff shardq accepts is far above the
-- longest one, so `least` still yields exactly that): the delay is stored,
-- not slept. A failure on the last attempt is `dead`, and so is a `dead`
-- ask (a failure the handler says no retry can mend) on any attempt. A
-- released job (claimed, never started) goes back uncounted: `queued`, or
-- `waiting` when it has a key (its key's lowest waiting job is queued when
-- the key is free).
-- A parked workflow (a durable sleep not over, which set its run_at to the
-- wake time) is `scheduled` until then, uncounted like a release, and
-- marked `parked` (every other outcome clears the mark).
-- A job whose cancellation was asked and that did not succeed is `cancelled`,
-- released or not; when the deadline pass asked it (NewJob::timeout,
-- store::deadlines), it keeps the error that pass wrote. A job without a
-- deadline pays one test of `cancel_requested` (false) for it.
--
-- Returns one row: written as succeeded, retrying, dead, cancelled, released
-- (each counting the rows written now and those written already), and how
-- many were written already (`already`: by an earlier try of this same write
-- whose reply was lost, or that committed while this one waited for its row
-- locks: the row still has this claim's fence and no owner, which no other
-- claim leaves); the rest were fenced out. A row counts as written already
-- only when it agrees with this write's ask: a success by a succeeded row, a
-- failure or release by a row that did not succeed. So a release of the same
-- claim written after its success (or a success after its release) is
-- fenced, never counted as a second success. The "written already" question
-- is a second statement, so its snapshot sees a concurrent try's commit
-- (tests/completion_retry_race.rs), and it runs only when the update wrote
-- fewer rows than the batch has: the common batch, written whole, probes
-- each row once.
--
-- Between the two statements this transaction holds the row locks of the
-- rows it updated, not of the ones it skipped: a claim, recovery or
-- retention may change those in between (re-claimed: fence differs; deleted:
-- not found), which makes them count as fenced, as they would have a moment
-- later. Only the counts depend on it; the worker lets go of every job of the
-- batch either way.
--
-- The batch is a MATERIALIZED CTE that carries the owner as a column and
-- every fence condition is a join condition (src/store/sql/complete.rs says
-- why), and the function keeps one generic plan per connection: planning the
-- statement took 5x longer than running it for one job. tests/plans.rs pins
-- that plan.
CREATE OR REPLACE FUNCTION shardq_complete_many(
    p_shard_keys int[], p_ids bigint[], p_fences bigint[], p_statuses text[],
    p_outputs jsonb[], p_owner text, p_errors text[],
    p_backoff_min_ms float8, p_backoff_max_ms float8)
RETURNS TABLE (succeeded bigint, retrying bigint, dead bigint, cancelled bigint,
               released bigint, already bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    d_succeeded bigint; d_retrying bigint; d_dead bigint; d_cancelled bigint;
    d_released bigint; d_all bigint; d_wakes bigint;
    a_succeeded bigint := 0; a_retrying bigint := 0; a_dead bigint := 0;
    a_cancelled bigint := 0; a_released bigint := 0; a_all bigint := 0;
BEGIN
    WITH batch AS MATERIALIZED (
        SELECT c.*, p_owner AS owner
        FROM unnest(p_shard_keys, p_ids, p_fences, p_statuses, p_outputs, p_errors)
            AS c(shard_key, id, fence, status, output, error)
    ), done AS (
        UPDATE workflow_status w SET
            status = CASE
                WHEN c.status = 'succeeded' THEN 'succeeded'
                WHEN w.cancel_requested THEN 'cancelled'
                WHEN c.status = 'released' THEN
                    CASE WHEN w.ordering_key IS NULL THEN 'queued' ELSE 'waiting' END
                WHEN c.status = 'parked' THEN 'scheduled'
                WHEN c.status = 'dead' OR w.attempts >= w.max_attempts THEN 'dead'
                ELSE 'scheduled' END,
            attempts = CASE WHEN c.status IN ('released', 'parked') THEN w.attempts - 1
                ELSE w.attempts END,
            started_at = CASE WHEN c.status IN ('released', 'parked') THEN NULL
                ELSE w.started_at END,
            run_at = CASE WHEN c.status = 'failed' AND NOT w.cancel_requested
                    AND w.attempts < w.max_attempts
                THEN now() + least(p_backoff_max_ms, p_backoff_min_ms
                    * power(2::float8, least(greatest(w.attempts - 1, 0), 62)))
                    * (0.5 + random() * 0.5) * interval '1 millisecond'
                ELSE w.run_at END,
            finished_at = CASE WHEN c.status IN ('succeeded', 'dead') OR w.cancel_requested
                    OR (c.status = 'failed' AND w.attempts >= w.max_attempts) THEN now() END,
            output = CASE WHEN c.status IN ('released', 'parked') THEN w.output ELSE c.output END,
            error = CASE WHEN w.cancel_requested AND c.status <> 'succeeded'
                    AND w.deadline_at <= now() AND w.error LIKE 'deadline passed at %'
                    THEN w.error
                WHEN c.status = 'released' AND w.cancel_requested
                    THEN 'cancelled before it started'
                WHEN c.status = 'released' THEN w.error
                WHEN c.status = 'parked' AND w.cancel_requested THEN 'cancelled while it waited'
                WHEN c.status = 'parked' THEN w.error ELSE c.error END,
            parked = c.status = 'parked' AND NOT w.cancel_requested,
            owner = NULL, lease_expires_at = NULL
        FROM batch c
        WHERE w.shard_key = c.shard_key AND w.id = c.id
            AND w.owner = c.owner AND w.fence = c.fence
        RETURNING w.status, w.parent_wake
    )
    SELECT count(*) FILTER (WHERE d.status = 'succeeded'),
        count(*) FILTER (WHERE d.status = 'scheduled'),
        count(*) FILTER (WHERE d.status = 'dead'),
        count(*) FILTER (WHERE d.status = 'cancelled'),
        count(*) FILTER (WHERE d.status IN ('queued', 'waiting')),
        count(*), count(*) FILTER (WHERE d.parent_wake)
    INTO d_succeeded, d_retrying, d_dead, d_cancelled, d_released, d_all, d_wakes
    FROM done d;
    IF d_wakes > 0 THEN
        -- Children of this batch that ended: wake their parents now, in a
        -- statement of its own (the trigger only flagged them; a parent may
        -- be a row the update above wrote). A parent whose row another
        -- transaction holds keeps the flag, for the promotion's pass.
        UPDATE workflow_status c SET parent_wake = NULL
        FROM unnest(p_shard_keys, p_ids) AS b(shard_key, id)
        WHERE c.shard_key = b.shard_key AND c.id = b.id AND c.parent_wake
            AND shardq_wake_parent(c.parent_shard_key, c.parent_id, c.shard_key, c.id);
        IF EXISTS (SELECT 1 FROM unnest(p_shard_keys, p_ids) AS b(shard_key, id)
                   JOIN workflow_status c ON c.shard_key = b.shard_key AND c.id = b.id
                   WHERE c.parent_wake) THEN
            -- Wakes left: parents on other shards (or rows locked now).
            -- The empty payload (no queue's name) rings the relay of
            -- this shard in every listening worker at commit
            -- (src/worker/wake_relay.rs), instead of its timer.
            PERFORM pg_notify('shardq_ready', '');
        END IF;
    END IF;
    IF d_all < cardinality(p_ids) THEN
        -- A statement of its own, so a snapshot of its own: it sees an
        -- earlier try that committed while the UPDATE waited for its row
        -- locks. Rows this transaction wrote just now are left out by xmin.
        SELECT count(*) FILTER (WHERE w.status = 'succeeded'),
            count(*) FILTER (WHERE w.status = 'scheduled'),
            count(*) FILTER (WHERE w.status = 'dead'),
            count(*) FILTER (WHERE w.status = 'cancelled'),
            count(*) FILTER (WHERE w.status IN ('queued', 'waiting')),
            count(*)
        INTO a_succeeded, a_retrying, a_dead, a_cancelled, a_released, a_all
        FROM unnest(p_shard_keys, p_ids, p_fences, p_statuses)
            AS c(shard_key, id, fence, status)
        JOIN workflow_status w
            ON w.shard_key = c.shard_key AND w.id = c.id AND w.fence = c.fence
            AND w.owner IS NULL
            AND (c.status = 'succeeded') = (w.status = 'succeeded')
            AND w.xmin IS DISTINCT FROM pg_current_xact_id_if_assigned()::xid;
    END IF;
    RETURN QUERY SELECT d_succeeded + a_succeeded, d_retrying + a_retrying, d_dead + a_dead,
        d_cancelled + a_cancelled, d_released + a_released, a_all;
END $$;
