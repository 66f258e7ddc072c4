-- Writes that are safe to send again after a lost reply: enqueue (ids taken
-- first) and the count of a retried completion.

-- Ids for an enqueue, taken before its insert: a retried insert with the same
-- ids is idempotent under the primary key (ON CONFLICT DO NOTHING), so an
-- enqueue whose reply was lost can be sent again without writing its jobs
-- twice, and without a token column or a new index on workflow_status.
--
-- The ids come from the table's own identity sequence, so they still grow
-- in the order enqueues are made: a call that returned before another began
-- holds smaller ids, which is all per-key order needs (migration 4: a key's
-- jobs run in id order among those committed when the key is taken).
--
-- SECURITY DEFINER: `nextval` needs a privilege on the sequence that a role
-- allowed to insert jobs does not have (an identity column needs none,
-- docs/least_privilege.sql); this function lends only that. Every name in
-- it is schema-qualified (the sequence is resolved now, from the identity
-- column), so the caller's search_path cannot redirect it; a `SET
-- search_path` clause would do the same at a cost on every call. plpgsql
-- keeps its plan per connection; one array, not a set, comes back.
DO $$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_reserve_ids(p_n int) RETURNS bigint[]
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER
        AS $b$
        BEGIN
            RETURN ARRAY(SELECT pg_catalog.nextval(%L::pg_catalog.regclass)
                         FROM pg_catalog.generate_series(1, p_n));
        END
        $b$
    $f$, pg_get_serial_sequence('workflow_status', 'id'));
END $$;

-- The completion counts a row an earlier try of the same write committed
-- while this one waited for its lock as written before (`already`), not as
-- fenced out.
--
-- A worker that gave up on a completion at its deadline sends it again.
-- When the server was frozen (SIGSTOP, a stalled disk) both tries run once
-- it resumes: the first writes the rows; the retry, whose snapshot is older
-- than that commit, waits for their row locks, re-checks them (owner NULL
-- now: not updated) and, until now, looked for "written before" in the same
-- snapshot, which did not see the first try's commit: the rows counted as
-- fenced, the worker's completed count and metrics stayed short of the jobs
-- done (`bench scale --disturb freeze` waited 600 s for four jobs that had
-- succeeded) and it warned of leases lost that were not
-- (tests/completion_retry_race.rs). The question is now a second statement.
--
-- Between the two statements this transaction holds the row locks of the
-- rows it updated, not of the ones it skipped: a claim, recovery or
-- retention may change those in between (re-claimed: fence differs; deleted:
-- not found), which makes them count as fenced, as they would have a moment
-- later. Only the counts depend on it; the worker lets go of every job of
-- the batch either way. The rules of the UPDATE are migration 15's (backoff
-- exponent capped), unchanged (src/store/sql/claim.rs, JOB_COMPLETE_MANY).

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
    d_released bigint; d_all bigint;
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
    )
    SELECT count(*) FILTER (WHERE d.status = 'succeeded'),
        count(*) FILTER (WHERE d.status = 'scheduled'),
        count(*) FILTER (WHERE d.status = 'dead'),
        count(*) FILTER (WHERE d.status = 'cancelled'),
        count(*) FILTER (WHERE d.status IN ('queued', 'waiting')),
        count(*)
    INTO d_succeeded, d_retrying, d_dead, d_cancelled, d_released, d_all
    FROM done d;
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
