-- shardq:no-transaction
-- Running and scheduled jobs by queue. `worker --until-empty` asks whether a
-- queue still has running or retrying jobs, and `shardq status` counts them
-- per queue: without this index both walked every running (or scheduled)
-- row of every queue. Only running and scheduled rows are in it, so a job
-- adds one entry when claimed and one when scheduled for a retry.
--
-- Built concurrently, outside a transaction: the fleet keeps claiming while
-- it builds (src/migrate/no_transaction.rs).
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_queue_active
    ON workflow_status (queue, status, attempts)
    WHERE status IN ('running', 'scheduled');

-- The planner otherwise takes queue and status as independent: with many
-- running rows of one queue it expects the others' running rows there too,
-- and walks the lease index (all running rows) instead of probing the index
-- above. Statistics on the pair correct it (tests/plans.rs). Taking them
-- locks out no writer.
CREATE STATISTICS IF NOT EXISTS workflow_status_queue_status (mcv)
    ON queue, status FROM workflow_status;
