-- shardq:no-transaction
-- Dead, failed and cancelled jobs by queue and state: the dashboard's and
-- `shardq status`'s counts of them read this index alone (index-only, the
-- visibility map kept by autovacuum), where the index of migration 9, in
-- order of finish for the lists, sent each count to the table for every
-- row: 0.8 s for 100,000 dead jobs, past the overview's deadline. Only a
-- job that ends badly pays for it. Built concurrently: the fleet keeps
-- claiming while it builds. State first: a list of one state's jobs (the
-- cancelled ones, say) may read it for that state's rows alone.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_failed_queue
    ON workflow_status (status, queue)
    WHERE status IN ('dead', 'failed', 'cancelled');
