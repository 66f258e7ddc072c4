-- shardq:no-transaction
-- The indexes of online resharding, built without blocking writes before
-- 0019 adds the `held` status they name.
--
-- A held job keeps its deduplication id taken: an enqueue of the same id on
-- the new shard of a moving range is a duplicate of the job copied there.
-- The new unique index is built first, then the old one dropped, so some
-- unique index covers every unfinished job at every moment.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_dedup_held
    ON workflow_status (queue, dedup_id)
    WHERE dedup_id IS NOT NULL AND status IN ('scheduled', 'queued', 'running', 'held');

DROP INDEX CONCURRENTLY IF EXISTS workflow_status_dedup;

-- The release of a moved range finds its held jobs by shard key.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_held
    ON workflow_status (shard_key) WHERE status = 'held';
