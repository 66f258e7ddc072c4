-- shardq:no-transaction
-- Parked workflows (a durable sleep, a recv or another wait not over), told
-- apart from delayed jobs and retries: `parked` is set by the outcome that
-- parks the workflow and cleared by every other outcome
-- (shardq_complete_many), so among `scheduled` rows it marks those that
-- wait for something. `shardq status`, the dashboard and the metrics count
-- them as `parked`, from the index below, index only. A constant default
-- is stored in the catalog: adding the column rewrites nothing.
ALTER TABLE workflow_status ADD COLUMN IF NOT EXISTS parked boolean NOT NULL DEFAULT false;

-- Scheduled jobs by queue, now with the mark: replaces
-- workflow_status_scheduled_queue (0006), whose two columns lead it, so
-- the probes that used the old one use this one alike. Only scheduled rows
-- are in it: no cost on the claim and completion path. Built concurrently,
-- outside a transaction: the fleet keeps claiming while it builds.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_scheduled_by_kind
    ON workflow_status (queue, attempts, parked)
    WHERE status = 'scheduled';

DROP INDEX CONCURRENTLY IF EXISTS workflow_status_scheduled_queue;
