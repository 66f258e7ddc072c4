-- shardq_key_floor_lower: the triggers workflow_status_key_floor_on_update
-- and _on_insert (created below, once), AFTER a keyed job becomes
-- unfinished (waiting, queued, running or scheduled) from finished or held
-- (a retry, a range move's release), moves to another key, or is written
-- as waiting or running: lowers its key's floor to the job's id
-- (migrations/0044_key_floors.sql), so the per-key reads that start at the
-- floor see it, whoever the writer is.
--
-- Jobs written queued or scheduled (every enqueue) do not fire it: a write
-- per enqueue would give the floor row a version per job, the walk the
-- floors remove. Their ids are above every floor, except a job that
-- commits after its key's floor passed its id (its id reserved earlier,
-- its transaction slow): it holds nothing back until a claim meets it as
-- its key's head and lowers the floor (shardq_claim_keyed;
-- docs/guarantees.md).
--
-- Always an upsert, even when the floor is already below the job: a
-- completion moving the floor up (shardq_promote_keys) compares the floor
-- row's xmin with the one it read, so a floor this trigger wrote
-- meanwhile, even unchanged, is never moved past this job by a move whose
-- snapshot could not see it. Without a row (floor 0) it writes one at 0.
-- shardq's writers of this kind hold the key's lock, as a move does (a
-- retry), or hold all the key's jobs (a range's release: no completion of
-- them moves a floor meanwhile); the comparison covers any other writer.
-- In a REPEATABLE READ transaction a floor row written since its snapshot
-- fails it with a serialization error (40001, to retry).
--
-- SECURITY DEFINER: a role that may write jobs needs no right on the
-- floors (docs/least_privilege.sql). Every name in it is schema-qualified
-- (resolved now, from workflow_status, which is why it is created by a DO
-- block), so a caller's search_path cannot redirect it.
DO $$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'workflow_status'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_key_floor_lower() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER
        AS $b$
        BEGIN
            INSERT INTO %1$s.shardq_key_floors AS f (queue, ordering_key, floor_id)
            VALUES (NEW.queue, NEW.ordering_key, 0)
            ON CONFLICT (queue, ordering_key) DO UPDATE
                SET floor_id = least(f.floor_id, NEW.id),
                    set_at = pg_catalog.now();
            RETURN NULL;
        END
        $b$
    $f$, s);
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
