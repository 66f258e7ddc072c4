-- shardq:no-transaction
-- Debounce (NewJob::debounce, docs/workflows.md#debounce): a debounced
-- job's pending run is a `scheduled` row with its key; each enqueue of the
-- key while it is pending updates that row (INSERT ... ON CONFLICT on the
-- index below) instead of adding one.
--
-- debounce_key: the job's debounce key (kept for the record after it ran).
-- debounce_until: the latest start of the pending run (the burst's first
-- enqueue plus max_wait, the shard's clock); set only while the run is
-- pending, cleared when the promotion queues it (JOB_PROMOTE_DUE) or a
-- finished one is retried by hand (JOB_RETRY), so a debounced job that
-- later retries or sleeps (`scheduled` again) never meets its key's next
-- pending run in the index.
--
-- Nullable columns without a default: a catalog change, no rewrite; every
-- existing row reads NULL.
ALTER TABLE workflow_status ADD COLUMN IF NOT EXISTS debounce_key text;
ALTER TABLE workflow_status ADD COLUMN IF NOT EXISTS debounce_until timestamptz;

-- At most one pending run per (queue, debounce key): `scheduled`, or
-- `held` by a range moving in (`shardq reshard` copies the pending runs
-- before it lets enqueues of the range in, so they meet the copy). A held
-- run asked to cancel leaves it: the release cancels that one, and a later
-- enqueue starts a new run. Built concurrently: no existing row is in it.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_debounce
    ON workflow_status (queue, debounce_key)
    WHERE debounce_until IS NOT NULL AND status IN ('scheduled', 'held')
      AND NOT cancel_requested;
