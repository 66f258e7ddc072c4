-- shardq:no-transaction
-- Keyed ready order (0037-0039): keyed claims read workflow_status_ready_keyed
-- from their floors; the keyed index ordered by id is read by nothing now,
-- and would cost every keyed job an index entry each time it becomes ready.
DROP INDEX CONCURRENTLY IF EXISTS workflow_status_dequeue_keyed;
