-- shardq:no-transaction
-- Ready order (0027): the ready index ordered by the number, built without
-- blocking writes (jobs ready before the numbering are in it with NULL,
-- until migration 29 numbers them).
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_ready_plain
    ON workflow_status (queue, priority, ready_seq)
    WHERE status = 'queued' AND ordering_key IS NULL AND job_group IS NULL;
