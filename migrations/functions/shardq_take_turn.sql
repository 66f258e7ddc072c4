-- shardq_take_turn: gives a grouped job its turn each time it becomes ready
-- (migration 0041), as a trigger on every write that makes one ready
-- (insert, promotion, recovery, release, retry, a move's copy or release,
-- a dashboard retry), so no writer can forget it: one past the highest
-- turn of its group's ready jobs of its priority (a bulk enqueue's rows see
-- the rows of the same statement before them; read from the end of the
-- group's line in workflow_status_group_lines, down to the round only, so
-- the read passes none of the line's jobs claimed in earlier rounds while
-- the horizon is held; its status is written as a range so that it can
-- use that index only, migrations/0043_grouped_index_roles.sql says why),
-- and at least one past the
-- queue's round (shardq_group_rounds): a group that had nothing ready
-- joins the next round, neither ahead of the groups being served nor
-- behind their backlogs, and the round moves on even when every group
-- queues one job at a time. Claims take grouped jobs by (turn, priority,
-- id) from the queue's grouped floor.
--
-- It takes the transaction's id, then a number of shardq_ready_seq (kept
-- nowhere), then reads the round: the floor passes a round only once every
-- transaction that could still write a turn below it has ended
-- (shardq_move_group_rounds says why that needs this order). A turn is at
-- most one past the highest number taken before it (by induction: one
-- past its line's last turn, or past the round), so a round moved to a
-- fresh number when no grouped job is ready is at or past every turn
-- given.
--
-- The round is read once per transaction and queue (kept in two
-- transaction-local settings, `shardq.group_round_queue` and
-- `shardq.group_round`; one joined by a separator would take a queue
-- named with it for another): every row of a batch would otherwise read
-- the queue's rounds (shardq_group_round_of, a function call per row). A
-- value read after the transaction took its id stays
-- safe for as long as it runs: the floor passes no round noted after that.
--
-- Under REPEATABLE READ or SERIALIZABLE the round would be read with the
-- transaction's snapshot, maybe older than the id: the job is left without
-- a turn, and the next move of the rounds (within 250 ms of a claim of its
-- queue) gives it the round then; the claims' ready probe finds it
-- meanwhile. While such a job is its group's only ready one, the group's next job
-- is numbered from the round alone.
--
-- What it does not promise: two producers of one group that commit at once
-- may give two jobs the same turn: the group gets one more job in that
-- round. A group's
-- lines of different priorities take their turns side by side: a group
-- gets a job per round for each priority it uses.
--
-- The turn's read is the end of one group's line, whatever the table's
-- statistics say: planned while they said the table was empty (a new
-- shard, or one emptied, after autovacuum's analyze), it was a scan of
-- the whole table for each job, cached by every session that enqueued
-- then until the statistics changed; a bulk enqueue of 16,000 grouped
-- jobs into such a table took 41-47 s instead of under 1 s
-- (tests/it/group_turns.rs). So sequential and bitmap scans are off
-- here, as in the claims.
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
        SET enable_seqscan = off
        SET enable_bitmapscan = off
        AS $b$
        DECLARE
            round_now bigint;
        BEGIN
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                NEW.turn := NULL;
                RETURN NEW;
            END IF;
            PERFORM pg_current_xact_id();
            PERFORM nextval('%1$s.shardq_ready_seq');
            IF current_setting('shardq.group_round_queue', true) = NEW.queue
               AND NEW.queue <> '' THEN
                round_now := nullif(current_setting('shardq.group_round', true), '')::bigint;
            ELSE
                round_now := (SELECT r.round FROM %1$s.shardq_group_rounds r
                              WHERE r.queue = NEW.queue);
                PERFORM set_config('shardq.group_round_queue', NEW.queue, true);
                PERFORM set_config('shardq.group_round', coalesce(round_now::text, ''), true);
            END IF;
            NEW.turn := greatest(0,
                (SELECT w.turn + 1 FROM %1$s.workflow_status w
                 WHERE w.queue = NEW.queue AND hashtext(w.job_group) = hashtext(NEW.job_group)
                   AND w.job_group = NEW.job_group AND w.priority = NEW.priority
                   AND w.status >= 'queued' AND w.status <= 'queued'
                   AND w.turn > coalesce(round_now, -1)
                 ORDER BY w.turn DESC LIMIT 1),
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
