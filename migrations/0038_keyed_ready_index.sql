-- shardq:no-transaction
-- Keyed ready order (0037): the keyed ready index ordered by the number,
-- built without blocking writes, and the keyed jobs ready now numbered
-- without a lock (migration 39 numbers, under one, those that became
-- ready meanwhile).
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_ready_keyed
    ON workflow_status (queue, priority, ready_seq)
    WHERE status = 'queued' AND ordering_key IS NOT NULL;

UPDATE workflow_status SET ready_seq = nextval('shardq_ready_seq')
WHERE status = 'queued' AND ordering_key IS NOT NULL AND ready_seq IS NULL;
