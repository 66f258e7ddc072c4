-- shardq_key_floor_lower: the triggers workflow_status_key_floor_on_update
-- and _on_insert (created below, once), AFTER a keyed job becomes
-- unfinished (waiting, queued, running or scheduled) from finished or held
-- (a retry, a range move's release), moves to another key, or is written
-- straight as waiting or running: lowers its key's floor to the job's id
-- (migrations/0044_key_floors.sql), so the per-key reads that start at
-- the floor see it. Whoever writes it: the invariant "no unfinished job of
-- a key below its floor" does not depend on each writer remembering it.
--
-- New jobs written queued or scheduled (every enqueue) do not fire it: their
-- ids come from the table's identity, above every floor, except one that
-- commits after a floor moved past its number. Such a job is queued (its
-- key's claim meets it as a head and lowers the floor) or scheduled (it
-- does not hold its key back before it is queued: as if enqueued after).
--
-- An upsert, not an update: when the key has no floor row (floor 0) it
-- writes one at 0; in a REPEATABLE READ transaction, a floor row written
-- since its snapshot fails it with a serialization error (40001, to retry)
-- instead of leaving a floor it cannot see above the job. A completion
-- moving the floor up compares the row's xmin (shardq_promote_keys), so a
-- floor lowered here meanwhile is never moved up past this job.
CREATE OR REPLACE FUNCTION shardq_key_floor_lower()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    INSERT INTO shardq_key_floors AS f (queue, ordering_key, floor_id)
    VALUES (NEW.queue, NEW.ordering_key, 0)
    ON CONFLICT (queue, ordering_key) DO UPDATE
        SET floor_id = least(f.floor_id, NEW.id), set_at = now();
    RETURN NULL;
END $$;

-- The triggers, created once (this file is run again whenever its text
-- changes: a CREATE TRIGGER each time would take the table's SHARE ROW
-- EXCLUSIVE lock each time). A job without a key, and every claim,
-- completion and enqueue of a keyed one, fail the WHEN test: no call.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
            WHERE tgname = 'workflow_status_key_floor_on_update'
              AND tgrelid = 'workflow_status'::regclass) THEN
        CREATE TRIGGER workflow_status_key_floor_on_update
            AFTER UPDATE OF status, queue, ordering_key ON workflow_status
            FOR EACH ROW
            WHEN (NEW.ordering_key IS NOT NULL
                  AND NEW.status IN ('waiting', 'queued', 'running', 'scheduled')
                  AND (OLD.status NOT IN ('waiting', 'queued', 'running', 'scheduled')
                       OR OLD.queue IS DISTINCT FROM NEW.queue
                       OR OLD.ordering_key IS DISTINCT FROM NEW.ordering_key))
            EXECUTE FUNCTION shardq_key_floor_lower();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
            WHERE tgname = 'workflow_status_key_floor_on_insert'
              AND tgrelid = 'workflow_status'::regclass) THEN
        CREATE TRIGGER workflow_status_key_floor_on_insert
            AFTER INSERT ON workflow_status
            FOR EACH ROW
            WHEN (NEW.ordering_key IS NOT NULL AND NEW.status IN ('waiting', 'running'))
            EXECUTE FUNCTION shardq_key_floor_lower();
    END IF;
END $$;
