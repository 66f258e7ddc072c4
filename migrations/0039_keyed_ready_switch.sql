-- Keyed ready order (0037, 0038), switched on. The lock waits for every
-- writer of jobs and holds off new ones until this commits: the keyed jobs
-- that became ready since migration 38 are numbered, and the trigger then
-- numbers every one from now on, with no job ready between the two
-- unnumbered (the claims that start at the keyed floors commit after this
-- migration, with the functions). Held while it numbers only what became
-- ready since migration 38.
LOCK TABLE workflow_status IN SHARE ROW EXCLUSIVE MODE;

UPDATE workflow_status SET ready_seq = nextval('shardq_ready_seq')
WHERE status = 'queued' AND ordering_key IS NOT NULL AND ready_seq IS NULL;

INSERT INTO shardq_ready_floors (queue, priority)
SELECT DISTINCT queue, priority FROM workflow_status
WHERE status = 'queued' AND ordering_key IS NOT NULL
ON CONFLICT DO NOTHING;

INSERT INTO shardq_ready_levels (queue, priority)
SELECT queue, priority FROM shardq_ready_floors
ON CONFLICT DO NOTHING;

-- The trigger of migration 27, now for every job without a group (as
-- migrations/functions/shardq_mark_ready.sql creates it): created here,
-- under the lock, so that no keyed job becomes ready unnumbered between
-- this commit and the functions' (migration 40 runs between them). On a
-- fresh shard the functions, the trigger among them, come at the end.
DO $$
BEGIN
    IF to_regprocedure('shardq_mark_ready()') IS NULL THEN
        RETURN;
    END IF;
    CREATE OR REPLACE TRIGGER shardq_ready_on_insert BEFORE INSERT ON workflow_status
        FOR EACH ROW
        WHEN (NEW.status = 'queued' AND NEW.job_group IS NULL)
        EXECUTE FUNCTION shardq_mark_ready();
    CREATE OR REPLACE TRIGGER shardq_ready_on_update
        BEFORE UPDATE OF status, queue, priority, ordering_key, job_group ON workflow_status
        FOR EACH ROW
        WHEN (NEW.status = 'queued' AND NEW.job_group IS NULL
              AND (OLD.status <> 'queued' OR OLD.queue <> NEW.queue
                   OR OLD.priority <> NEW.priority
                   OR OLD.ordering_key IS DISTINCT FROM NEW.ordering_key
                   OR OLD.job_group IS NOT NULL))
        EXECUTE FUNCTION shardq_mark_ready();
END $$;
