-- Per-key ordering across the fleet: a job with an ordering key is claimable
-- only when no earlier job of its key is queued or running. This index answers
-- that check for the few unfinished jobs of one key. (Migration 4 replaced
-- the check with key locks and drops this index; migrations/schema.sql
-- shows what a migrated shard has.)
CREATE INDEX workflow_status_key_order
    ON workflow_status (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND status IN ('queued', 'running');
