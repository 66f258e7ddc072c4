-- shardq_take_turn: gives a grouped job its turn each time it becomes ready
-- (migration 0041), as a trigger on every write that makes one ready
-- (insert, promotion, recovery, release, retry, a move's copy or release,
-- a dashboard retry), so no writer can forget it: one past the turn of its
-- group's newest ready job of its priority (a bulk enqueue's rows see the
-- rows of the same statement before them), and at least one past the
-- queue's round (shardq_group_rounds): a group that had nothing ready
-- joins the next round, neither ahead of the groups being served nor
-- behind their backlogs, and the round moves on even when every group
-- queues one job at a time. Claims take grouped jobs by (turn, priority,
-- id) from the queue's grouped floor.
--
-- It takes the transaction's id before it reads the round: the floor
-- passes a round only once every transaction that could still write a
-- turn below it has ended (shardq_advance_group_round says why that needs
-- this order). Under REPEATABLE READ or SERIALIZABLE the round is read
-- with the transaction's snapshot, maybe older than the id, so the row is
-- locked (FOR SHARE: a move committed after the snapshot refuses it with
-- 40001, to run the transaction again; until it ends, moves of the queue's
-- rounds skip, as its id already holds the floor back), or made when
-- missing (one made after the snapshot refuses it the same way).
--
-- It also takes a number from shardq_ready_seq, and keeps none: a turn is
-- never above the number taken with it (by induction: one past its line's
-- last turn or the round, both at most earlier numbers; migration 42 moves
-- the sequence past the turns it gave), so a round moved to a fresh number
-- when no grouped job is ready is past every turn given.
--
-- What it does not promise: two producers of one group that commit at once
-- may give two jobs the same turn, and so may retries or promotions of a
-- group's older jobs while a newer one is ready (its line is read at its
-- newest job by id): the group gets one more job in that round. A group's
-- lines of different priorities take their turns side by side: a group
-- gets a job per round for each priority it uses.
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
        DECLARE
            round_now bigint;
        BEGIN
            PERFORM pg_current_xact_id();
            PERFORM nextval('%1$s.shardq_ready_seq');
            IF current_setting('transaction_isolation') = 'read committed' THEN
                round_now := (SELECT r.round FROM %1$s.shardq_group_rounds r
                              WHERE r.queue = NEW.queue);
            ELSE
                SELECT r.round INTO round_now FROM %1$s.shardq_group_rounds r
                WHERE r.queue = NEW.queue FOR SHARE;
                IF NOT FOUND THEN
                    INSERT INTO %1$s.shardq_group_rounds (queue) VALUES (NEW.queue)
                    ON CONFLICT DO NOTHING;
                END IF;
            END IF;
            NEW.turn := greatest(0,
                (SELECT w.turn + 1 FROM %1$s.workflow_status w
                 WHERE w.queue = NEW.queue AND hashtext(w.job_group) = hashtext(NEW.job_group)
                   AND w.job_group = NEW.job_group AND w.priority = NEW.priority
                   AND w.status = 'queued'
                 ORDER BY w.id DESC LIMIT 1),
                round_now + 1);
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
-- writer of jobs out until this transaction commits. Rows a claim of the
-- functions before these holds are left (waiting for them could deadlock
-- with that claim's update): the first move of their queue's rounds
-- numbers them (shardq_advance_group_round), and the grouped ready probe
-- finds them (shardq_queue_has_ready). Usually none: a probe of the
-- grouped ready index's end.
UPDATE workflow_status SET turn = 0
WHERE ctid = ANY (ARRAY(
    SELECT w.ctid FROM workflow_status w
    WHERE w.status = 'queued' AND w.job_group IS NOT NULL AND w.turn IS NULL
    FOR UPDATE SKIP LOCKED));
