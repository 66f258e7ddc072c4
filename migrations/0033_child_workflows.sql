-- shardq:no-transaction
-- Child workflows (JobContext::start_child, ChildHandle::result), on their
-- parent's shard. Two nullable columns without default (a catalog change,
-- no rewrite), two partial indexes built without blocking writes, and (with
-- its function) a row trigger whose WHEN clause is false for every job
-- without a parent.
--
-- `parent_shard_key`, `parent_id`: the workflow (on this shard) that
-- started this job as a child; NULL for every other job. A child with an
-- ordering key or a group has its key's shard key, not its parent's. `parent_wake`: true while the job finished and
-- its parent was busy (locked) at that moment, so the promotion of due
-- jobs wakes the parent instead (shardq_wake_parents). Both travel with the
-- row, so a range move (`shardq reshard`) carries them.
ALTER TABLE workflow_status ADD COLUMN IF NOT EXISTS parent_shard_key integer;

ALTER TABLE workflow_status ADD COLUMN IF NOT EXISTS parent_id bigint;

ALTER TABLE workflow_status ADD COLUMN IF NOT EXISTS parent_wake boolean;

-- true: a cancel of the parent leaves this child running
-- (ChildPolicy::Abandon); NULL: it is cancelled with its parent.
ALTER TABLE workflow_status ADD COLUMN IF NOT EXISTS abandon_on_parent_cancel boolean;

-- A parent's children (the cancel cascade, `shardq job show`).
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_children
    ON workflow_status (parent_shard_key, parent_id) WHERE parent_id IS NOT NULL;

-- Finished children whose parent is still to be woken (almost always none).
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_parent_wakes
    ON workflow_status (shard_key, id) WHERE parent_wake;

-- The trigger that wakes a finished child's parent is created with its
-- function (migrations/functions/shardq_child_finished.sql), which this
-- run writes after its table migrations.
