-- The retry backoff of a failed job cannot overflow.
--
-- Migration 14 computed the delay as `min * 2^(attempts - 1)` before taking
-- the least of it and the longest backoff: at about attempt 1,025 the power
-- overflows float8 (SQLSTATE 22003, `value out of range: overflow`), so the
-- failure of such a job could never be written and it stayed `running`.
-- The exponent is now capped at 62: 2^62 times any backoff shardq accepts
-- (worker.retry_backoff_max_ms is at most 7 days, src/config/validate.rs)
-- is far inside float8 and far above the longest backoff, so the `least`
-- still yields exactly that longest backoff. Only that expression changed;
-- everything else is migration 14's statement (its rules are documented at
-- JOB_COMPLETE_MANY in src/store/sql/claim.rs).

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
BEGIN
    RETURN QUERY
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
                WHEN w.attempts >= w.max_attempts THEN 'dead'
                ELSE 'scheduled' END,
            attempts = CASE WHEN c.status = 'released' THEN w.attempts - 1 ELSE w.attempts END,
            started_at = CASE WHEN c.status = 'released' THEN NULL ELSE w.started_at END,
            run_at = CASE WHEN c.status = 'failed' AND NOT w.cancel_requested
                    AND w.attempts < w.max_attempts
                THEN now() + least(p_backoff_max_ms, p_backoff_min_ms
                    * power(2::float8, least(greatest(w.attempts - 1, 0), 62)))
                    * (0.5 + random() * 0.5) * interval '1 millisecond'
                ELSE w.run_at END,
            finished_at = CASE WHEN c.status = 'succeeded' OR w.cancel_requested
                    OR (c.status = 'failed' AND w.attempts >= w.max_attempts) THEN now() END,
            output = CASE WHEN c.status = 'released' THEN w.output ELSE c.output END,
            error = CASE WHEN c.status = 'released' AND w.cancel_requested
                    THEN 'cancelled before it started'
                WHEN c.status = 'released' THEN w.error ELSE c.error END,
            owner = NULL, lease_expires_at = NULL
        FROM batch c
        WHERE w.shard_key = c.shard_key AND w.id = c.id
            AND w.owner = c.owner AND w.fence = c.fence
        RETURNING w.status
    ), again AS (
        SELECT w.status FROM batch c JOIN workflow_status w
            ON w.shard_key = c.shard_key AND w.id = c.id AND w.fence = c.fence
            AND w.owner IS NULL
            AND (c.status = 'succeeded') = (w.status = 'succeeded')
        WHERE (SELECT count(*) FROM done) < (SELECT count(*) FROM batch)
    )
    SELECT count(*) FILTER (WHERE written.status = 'succeeded'),
        count(*) FILTER (WHERE written.status = 'scheduled'),
        count(*) FILTER (WHERE written.status = 'dead'),
        count(*) FILTER (WHERE written.status = 'cancelled'),
        count(*) FILTER (WHERE written.status IN ('queued', 'waiting')),
        (SELECT count(*) FROM again)
    FROM (SELECT status FROM done UNION ALL SELECT status FROM again) written;
END $$;
