-- shardq:no-transaction
-- The indexes of groups (0022), built without blocking writes.
--
-- The plain dequeue index no longer holds grouped jobs, so a group's
-- backlog never lies in the way of the queue's other jobs, and a queue
-- without groups claims from it as before. The new index is built first,
-- then the old one dropped: the claim functions written at the end of this
-- run read the new one (until then, a claim of a queue without groups
-- scans the table for a few seconds). Binaries older than this migration
-- read queue depths by the old index: upgrade them with it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_dequeue_plain
    ON workflow_status (queue, priority, id)
    WHERE status = 'queued' AND ordering_key IS NULL AND job_group IS NULL;

-- Ready grouped jobs by group, ordered by the hash of the name first (a
-- random point of the hash space is a fair place to start taking turns),
-- then the name (two names with one hash stay two groups), each group's
-- in claim order.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_dequeue_grouped
    ON workflow_status (queue, hashtext(job_group), job_group, priority, id)
    WHERE status = 'queued' AND job_group IS NOT NULL;

-- Running grouped jobs by group: a group's concurrency is counted here.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_running_grouped
    ON workflow_status (queue, job_group)
    WHERE status = 'running' AND job_group IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS workflow_status_dequeue;
