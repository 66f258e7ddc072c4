-- shardq:no-transaction
-- Each grouped index serves only the statements made for it. Three partial
-- indexes hold the queued grouped jobs: workflow_status_ready_grouped (by
-- turn: the claims' walk and the ready probes), workflow_status_group_lines
-- (each group's line: a new job's turn) and
-- workflow_status_dequeue_grouped (each group's head: claims of queues
-- with group limits). Planned with statistics taken when few jobs were
-- queued, every one of them looks one row cheap for a probe of the queue,
-- and the planner picked among them by chance: measured under a held
-- horizon, the ready probe walked group_lines and the probe for jobs
-- without a turn dequeue_grouped, every dead entry of the queue (45,000
-- buffers, 140 ms a probe, two probes a claim).
--
-- The same tie the other way: a new job's turn, read from ready_grouped
-- (its queue's turns, backward, filtered by group) instead of its group's
-- line, made a bulk enqueue read every job queued before it in the same
-- statement: an insert of 5,000 grouped jobs ran 1-2 s at full CPU (seen
-- in pg_stat_activity in a run that was stopped).
--
-- So the conditions name each index's role. The line and head indexes
-- carry `hashtext(job_group) IS NOT NULL` (true of every grouped job):
-- only a statement that compares hashtext(job_group) with something (a
-- strict operator), as the turn's read and the group-head walk do, can use
-- them; the probes, which do not, have ready_grouped alone. The line index
-- states its status as a range (`status >= 'queued' AND status <=
-- 'queued'`, the same rows), and the turn's read states it so: that proves
-- the line index's condition but not the `status = 'queued'` of
-- ready_grouped and dequeue_grouped, so the turn's read has the line index
-- alone. Built beside the old ones without blocking writes, then swapped
-- in under the old names.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_group_lines_by_hash
    ON workflow_status (queue, hashtext(job_group), job_group, priority, turn)
    WHERE status >= 'queued' AND status <= 'queued' AND job_group IS NOT NULL
      AND hashtext(job_group) IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS workflow_status_group_lines;
ALTER INDEX IF EXISTS workflow_status_group_lines_by_hash RENAME TO workflow_status_group_lines;

CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_dequeue_grouped_by_hash
    ON workflow_status (queue, hashtext(job_group), job_group, priority, id)
    WHERE status = 'queued' AND job_group IS NOT NULL AND hashtext(job_group) IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS workflow_status_dequeue_grouped;
ALTER INDEX IF EXISTS workflow_status_dequeue_grouped_by_hash RENAME TO workflow_status_dequeue_grouped;
