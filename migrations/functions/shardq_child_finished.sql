-- shardq_child_finished: the trigger workflow_status_child_finished
-- (created below, once), BEFORE a child's status becomes final (succeeded,
-- failed, dead, cancelled), whoever writes it (a completion, a cancel, a
-- recovery, a deadline): flags the child (`parent_wake`) in the same row
-- version that makes it final, so the wake is never lost. It wakes no row
-- itself: a completion writes many rows in one statement, and a parent
-- woken from inside it (a row the same statement writes later, its park)
-- would make that statement fail on every retry ("tuple already modified
-- by an operation triggered by the current command"). The writer settles
-- the flag after its statement (shardq_complete_many does, in its next
-- statement), or the promotion of due jobs does (shardq_wake_parents).
-- Its WHEN clause is false for every job without a parent.
CREATE OR REPLACE FUNCTION shardq_child_finished()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    NEW.parent_wake := true;
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
