-- shardq_take_turn: gives a grouped job its turn each time it becomes ready
-- (migration 0041), as a trigger on every write that makes one ready
-- (insert, promotion, recovery, release, retry, a move's release, a
-- dashboard retry), so no writer can forget it: one past the turn of its
-- group's newest ready job of its priority (a bulk enqueue's rows see the
-- rows of the same statement before them), and at least the queue's round
-- (shardq_group_rounds), so a group that had nothing ready joins the round
-- being claimed instead of jumping ahead of it or waiting behind the
-- others' backlogs. Claims take grouped jobs by (turn, priority, id).
--
-- It takes the transaction's id before it reads the round: a floor passes
-- a round only once every transaction that could still write a turn below
-- it has ended (shardq_advance_group_round says why that needs this order).
--
-- It also takes a number from shardq_ready_seq, and keeps none: a turn is
-- never above the number taken with it (by induction: one past its line's
-- last turn, or the round, both at most earlier numbers), so a round moved
-- to a fresh number when no grouped job is ready is past every turn given.
--
-- Two producers of one group that commit at once may give two jobs the
-- same turn: the group gets one more job in that round, no job is lost
-- (every ready grouped job is in the claim's index, numbered or not).
-- A group's lines of different priorities take their turns side by side:
-- its urgent jobs do not wait behind its backlog of others.
--
-- SECURITY DEFINER with a fixed search_path: a producer needs no right on
-- the rounds, and every name is schema-qualified (resolved now, from
-- workflow_status, which is why it is created by a DO block).
DO $$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'workflow_status'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_take_turn() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        SET plan_cache_mode = force_generic_plan
        AS $b$
        BEGIN
            PERFORM pg_catalog.pg_current_xact_id();
            PERFORM pg_catalog.nextval('%1$s.shardq_ready_seq');
            NEW.turn := greatest(0,
                (SELECT w.turn + 1 FROM %1$s.workflow_status w
                 WHERE w.queue = NEW.queue AND hashtext(w.job_group) = hashtext(NEW.job_group)
                   AND w.job_group = NEW.job_group AND w.priority = NEW.priority
                   AND w.status = 'queued'
                 ORDER BY w.id DESC LIMIT 1),
                (SELECT r.round FROM %1$s.shardq_group_rounds r WHERE r.queue = NEW.queue));
            RETURN NEW;
        END
        $b$
    $f$, s);
END $$;

CREATE OR REPLACE TRIGGER shardq_turn_on_insert BEFORE INSERT ON workflow_status
    FOR EACH ROW
    WHEN (NEW.status = 'queued' AND NEW.job_group IS NOT NULL)
    EXECUTE FUNCTION shardq_take_turn();

CREATE OR REPLACE TRIGGER shardq_turn_on_update
    BEFORE UPDATE OF status, queue, priority, job_group ON workflow_status
    FOR EACH ROW
    WHEN (NEW.status = 'queued' AND NEW.job_group IS NOT NULL
          AND (OLD.status <> 'queued' OR OLD.queue <> NEW.queue OR OLD.priority <> NEW.priority
               OR OLD.job_group IS DISTINCT FROM NEW.job_group))
    EXECUTE FUNCTION shardq_take_turn();

-- Grouped jobs that became ready without a turn (during an upgrade to
-- schema 42, or held by a claim while migration 42 numbered): the first
-- turn. The triggers' replacement above holds a lock that keeps every
-- writer of jobs out until this transaction commits. Usually none: one
-- probe of the grouped ready index.
UPDATE workflow_status SET turn = 0
WHERE status = 'queued' AND job_group IS NOT NULL AND turn IS NULL;
