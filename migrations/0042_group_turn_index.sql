-- shardq:no-transaction
-- Group turns (0041): the grouped ready index in turn order, built without
-- blocking writes, and the grouped jobs ready now numbered: each group's
-- jobs of a priority 1, 2, 3, ... by id, one group to a transaction
-- (rows a claim holds are left, so claims go on). Grouped jobs that become
-- ready until the new functions commit, and those a claim held, are left
-- without a turn: a move of the rounds after the first claim of their
-- queue numbers them (migrations/functions/shardq_move_group_rounds.sql),
-- and the claims' ready probe finds them meanwhile.
--
-- workflow_status_dequeue_grouped stays: the claims of queues with group
-- limits walk the groups' heads in it, and the new jobs' turns are read
-- from its newest entry of their group.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_ready_grouped
    ON workflow_status (queue, turn, priority, id)
    WHERE status = 'queued' AND job_group IS NOT NULL;

-- Each group's line of ready jobs by turn: a new job's turn is one past
-- its line's highest, read backward from the end of the line and no lower
-- than the queue's round, so the read passes only the line's jobs claimed
-- in the current round, however long the horizon is held.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_group_lines
    ON workflow_status (queue, hashtext(job_group), job_group, priority, turn)
    WHERE status = 'queued' AND job_group IS NOT NULL;

DO $$
DECLARE
    line record;
BEGIN
    FOR line IN SELECT DISTINCT w.queue, w.job_group, w.priority FROM workflow_status w
                WHERE w.status = 'queued' AND w.job_group IS NOT NULL AND w.turn IS NULL LOOP
        WITH held AS (
            SELECT w.ctid AS tid, w.id FROM workflow_status w
            WHERE w.queue = line.queue AND hashtext(w.job_group) = hashtext(line.job_group)
              AND w.job_group = line.job_group AND w.priority = line.priority
              AND w.status = 'queued' AND w.turn IS NULL
            FOR UPDATE SKIP LOCKED)
        UPDATE workflow_status w SET turn = n.turn
        FROM (SELECT h.tid, row_number() OVER (ORDER BY h.id) AS turn FROM held h) n
        WHERE w.ctid = n.tid;
        COMMIT;
    END LOOP;
END $$;

-- Turns stay at or below the numbers of shardq_ready_seq taken with them
-- (migrations/functions/shardq_take_turn.sql): the sequence moves past the
-- turns given here.
SELECT setval('shardq_ready_seq', t.top)
FROM (SELECT max(turn) AS top FROM workflow_status
      WHERE status = 'queued' AND job_group IS NOT NULL) t
WHERE t.top > (SELECT last_value FROM shardq_ready_seq);
