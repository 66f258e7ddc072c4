-- Job lifecycle: scheduled (delayed or retrying) jobs, attempt limits, dead
-- and cancelled jobs, deduplication, retention.
--
-- A job that is not ready yet is 'scheduled' (not 'queued'), so the dequeue
-- index holds only ready jobs and a claim never walks past future ones. The
-- maintenance loop promotes due scheduled jobs to 'queued'.

ALTER TABLE workflow_status DROP CONSTRAINT workflow_status_status_check;
ALTER TABLE workflow_status ADD CONSTRAINT workflow_status_status_check
    CHECK (status IN ('scheduled', 'queued', 'running', 'succeeded', 'failed', 'dead', 'cancelled'));

ALTER TABLE workflow_status
    ADD COLUMN run_at           timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN max_attempts     integer     NOT NULL DEFAULT 20 CHECK (max_attempts >= 1),
    ADD COLUMN dedup_id         text,
    ADD COLUMN cancel_requested boolean     NOT NULL DEFAULT false;

-- Promotion of due scheduled jobs.
CREATE INDEX workflow_status_scheduled
    ON workflow_status (run_at)
    WHERE status = 'scheduled';

-- Deduplication: one unfinished job per (queue, dedup_id). The dedup id routes
-- the job (when it has no ordering key), so the check stays on one shard.
CREATE UNIQUE INDEX workflow_status_dedup
    ON workflow_status (queue, dedup_id)
    WHERE dedup_id IS NOT NULL AND status IN ('scheduled', 'queued', 'running');

-- Retention deletes finished rows oldest first.
CREATE INDEX workflow_status_finished
    ON workflow_status (finished_at)
    WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled');

-- Per-key ordering now also waits for a scheduled (retrying or delayed)
-- earlier job. (Migration 4 drops this index again for workflow_status_key.)
DROP INDEX workflow_status_key_order;
CREATE INDEX workflow_status_key_order
    ON workflow_status (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND status IN ('scheduled', 'queued', 'running');

-- Step outputs are only ever inserted; no room is needed for updates.
ALTER TABLE workflow_steps SET (fillfactor = 100);
