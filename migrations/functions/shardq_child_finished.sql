-- shardq_child_finished: the trigger workflow_status_child_finished
-- (created below, once), BEFORE a child's status becomes final (succeeded,
-- failed, dead, cancelled), whoever writes it (a completion, a cancel, a
-- recovery): wakes its parent (shardq_wake_parent), or, when the parent's
-- row is locked by another transaction now, flags the child
-- (`parent_wake`) for the promotion of due jobs (shardq_wake_parents),
-- in the same row version that makes it final: the wake is never lost,
-- only later. Its WHEN clause is false for every job without a parent.
CREATE OR REPLACE FUNCTION shardq_child_finished()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF NOT shardq_wake_parent(NEW.parent_shard_key, NEW.parent_id, NEW.shard_key, NEW.id) THEN
        NEW.parent_wake := true;
    END IF;
    RETURN NEW;
END $$;

-- The trigger, created once (this file is run again whenever its text
-- changes: a CREATE TRIGGER each time would take the table's SHARE ROW
-- EXCLUSIVE lock each time). A job without a parent fails the WHEN test
-- at its first term: no call, nothing queued.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
            WHERE tgname = 'workflow_status_child_finished'
              AND tgrelid = 'workflow_status'::regclass) THEN
        CREATE TRIGGER workflow_status_child_finished
            BEFORE UPDATE OF status ON workflow_status
            FOR EACH ROW
            WHEN (NEW.parent_id IS NOT NULL
                  AND NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled')
                  AND OLD.status NOT IN ('succeeded', 'failed', 'dead', 'cancelled'))
            EXECUTE FUNCTION shardq_child_finished();
    END IF;
END $$;
