-- shardq:no-transaction
-- Workflow deadlines (NewJob::timeout): the shard's clock at enqueue plus
-- the timeout, NULL for a job without one. Nullable without a default:
-- adding it rewrites nothing, and a job without a deadline stores no byte
-- for it (a null bit).
ALTER TABLE workflow_status ADD COLUMN IF NOT EXISTS deadline_at timestamptz;

-- The deadline pass (src/worker/promoter.rs, JOB_FIND_PAST_DEADLINE) reads
-- the unfinished rows with a deadline whose cancellation is not asked yet,
-- earliest first; the promoter's sleep probes its first entry. Jobs
-- without a deadline are not in it: no cost on the claim and completion
-- path for them. Built concurrently, outside a transaction: the fleet
-- keeps claiming while it builds.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_deadline
    ON workflow_status (deadline_at)
    WHERE deadline_at IS NOT NULL AND NOT cancel_requested
        AND status IN ('waiting', 'scheduled', 'queued', 'running');
