-- shardq:no-transaction
-- The primary key leads with the job id, not the shard key.
--
-- Shard keys are random (a hash of whatever the caller routes by), so under
-- (shard_key, id) every new job's key landed on a random leaf of an index as
-- large as the whole history: once the history outgrew shared_buffers each
-- enqueue read a leaf from outside it (0.9 pages per job at 10M finished
-- rows, `cargo bench --bench history`). Ids grow, so under (id, shard_key)
-- every insert goes to the rightmost leaf. Lookups give both columns, and
-- the key still holds the shard key, which is all a router needs.
--
-- Built concurrently; the swap itself takes ACCESS EXCLUSIVE on both tables
-- for as long as it takes to rename an index and drop one (no scan), and
-- waits at most 5 s for it: a shard busy with a long transaction fails the
-- migration with a lock timeout instead of stalling its claims, and
-- `shardq migrate` can be run again. The foreign key of the steps is added
-- back NOT VALID in the same transaction and validated afterwards without
-- blocking writes.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_id_shard_key
    ON workflow_status (id, shard_key);

DO $$
BEGIN
    -- Run again after the swap (a failed validation, say): nothing to swap.
    IF (SELECT indkey::text FROM pg_index WHERE indexrelid = 'workflow_status_pkey'::regclass)
        = (SELECT indkey::text FROM pg_index WHERE indexrelid = 'workflow_status_id_shard_key'::regclass) THEN
        RETURN;
    END IF;
    SET LOCAL lock_timeout = '5s';
    ALTER TABLE workflow_status
        DROP CONSTRAINT workflow_status_pkey CASCADE,
        ADD CONSTRAINT workflow_status_pkey PRIMARY KEY USING INDEX workflow_status_id_shard_key;
    ALTER TABLE workflow_steps
        ADD CONSTRAINT workflow_steps_shard_key_workflow_id_fkey
        FOREIGN KEY (shard_key, workflow_id) REFERENCES workflow_status (shard_key, id)
        ON DELETE CASCADE NOT VALID;
END $$;

-- Only where the migration ran again after the swap: the index built anew.
DROP INDEX CONCURRENTLY IF EXISTS workflow_status_id_shard_key;

ALTER TABLE workflow_steps VALIDATE CONSTRAINT workflow_steps_shard_key_workflow_id_fkey;
