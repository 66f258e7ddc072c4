-- shardq:no-transaction
-- One index of each group's line instead of two. Queued grouped jobs were
-- kept in two indexes placed by group: workflow_status_group_lines (by
-- priority and turn: a new job's turn) and workflow_status_dequeue_grouped
-- (by priority and id: the heads and runs that claims of queues with group
-- limits take). Each enqueued grouped job wrote an entry at its group's
-- place in both. While a long transaction holds vacuum back, every group's
-- place in each keeps the dead entries of its claimed jobs: with 10,000
-- groups that is a leaf page per group and index written at random, and
-- the two outgrew the buffer cache together (round 26: an enqueued job
-- dirtied two pages held, against 0.05 without).
--
-- The line index now ends with the id as well, (queue, hashtext(job_group),
-- job_group, priority, turn, id), and serves both: a new job's turn (the
-- line's last turn) and the limited claims' heads and runs, which take a
-- group's jobs by (priority, turn, id), the order they became ready, as
-- the claims of queues without group limits do. Its condition states the
-- status as a range and needs `hashtext(job_group) IS NOT NULL`, so only
-- the statements written for it use it (0043 says why).
--
-- Built beside the old ones without blocking writes, then swapped in under
-- the line index's name. Until this run's functions commit (the closing
-- transaction of `migrate`), the old limited claim finds its heads and
-- runs in the new index (its `status = 'queued'` implies the range),
-- sorting each group's jobs of a priority by id.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_group_lines_with_id
    ON workflow_status (queue, hashtext(job_group), job_group, priority, turn, id)
    WHERE status >= 'queued' AND status <= 'queued' AND job_group IS NOT NULL
      AND hashtext(job_group) IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS workflow_status_group_lines;
ALTER INDEX IF EXISTS workflow_status_group_lines_with_id RENAME TO workflow_status_group_lines;
DROP INDEX CONCURRENTLY IF EXISTS workflow_status_dequeue_grouped;
