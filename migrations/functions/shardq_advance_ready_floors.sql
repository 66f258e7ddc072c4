-- shardq_advance_ready_floors: moves each queue's ready floors
-- (shardq_ready_floors, migration 0027: plain jobs; 0037: keyed ones; a
-- view of shardq_ready_floor_moves since 0047) up
-- to the first job of their kind still ready, and each queue's grouped
-- rounds (shardq_move_group_rounds, migration 0041),
-- at most every 250 ms and by one caller at a time (the others go on at
-- once). Called by the plain and grouped claims, before they lock a job,
-- so the floors follow wherever jobs are claimed.
--
-- A floor may pass a number only when no transaction can still make a job
-- ready with it. Each move therefore takes a number S, then a transaction
-- id X (after S: ids are given in order, so every transaction that took a
-- number below S got its id, which the trigger takes first, before X),
-- and leaves both in shardq_ready_barrier (a row of its own, keyed by S,
-- that replaces the last move's). The next move waits until no
-- transaction older than X runs (the oldest running id of a fresh
-- snapshot is past X); then every job numbered below S is written and
-- visible, or never will be, and the floor goes to the first ready job at
-- or past the old floor, or to S when there is none. A job ready again
-- later gets a new number, past S. X is this transaction's own id, so a
-- caller that already has one (it wrote before) does not move the floors.
--
-- The walk from the old floor to the first ready job passes only what was
-- claimed since the last move; under a held horizon that is the only part
-- of the dead versions a claim walks. A transaction that wrote and stays
-- open (idle in transaction) holds the floors where they are until it
-- ends; a read-only one (a report, pg_dump) has no id and does not.
--
-- SECURITY DEFINER with a fixed search_path: it calls
-- shardq_move_group_rounds, which only the owner may call. It takes no
-- argument, so any caller can only make the move a claim makes, at most
-- every 250 ms.
DO $$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'workflow_status'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_advance_ready_floors() RETURNS void
        LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        SET plan_cache_mode = force_generic_plan
        AS $b$
        DECLARE
            every constant interval := interval '250 milliseconds';
            b record;
            s bigint;
            x xid8;
            passed boolean;
        BEGIN
            IF pg_current_xact_id_if_assigned() IS NOT NULL
               OR NOT pg_try_advisory_xact_lock(hashtext('shardq_ready_floors')::bigint) THEN
                RETURN;
            END IF;
            -- The barrier's newest row (migration 0049: a move replaces the row it
            -- read by a new one; under a held horizon the replaced ones lie behind
            -- it in this backward walk of the primary key, never read).
            SELECT r.pending_seq, r.pending_xid, r.advanced_at INTO b
                FROM %1$s.shardq_ready_barrier r ORDER BY r.pending_seq DESC LIMIT 1;
            IF NOT FOUND OR b.advanced_at > clock_timestamp() - every THEN
                RETURN;
            END IF;
            -- The number, then the id: two statements, in this order.
            s := nextval('%1$s.shardq_ready_seq');
            x := pg_current_xact_id();
            passed := b.pending_xid IS NOT NULL
                AND pg_snapshot_xmin(pg_current_snapshot()) > b.pending_xid;
            -- Each floor that rises gets a new row, numbered by this move, and
            -- loses the one it replaces, in one statement (migration 0047: no
            -- floor's row is ever updated, so reading one never walks versions).
            IF passed THEN
                WITH moved AS (
                    SELECT fl.queue, fl.priority, fl.move_seq, fl.floor_seq, fl.keyed_floor_seq,
                           greatest(fl.floor_seq, LEAST(b.pending_seq,
                               (SELECT w.ready_seq FROM %1$s.workflow_status w
                                WHERE w.queue = fl.queue AND w.priority = fl.priority
                                  AND w.status = 'queued' AND w.ordering_key IS NULL
                                  AND w.job_group IS NULL AND w.ready_seq >= fl.floor_seq
                                ORDER BY w.ready_seq LIMIT 1))) AS new_floor_seq,
                           greatest(fl.keyed_floor_seq, LEAST(b.pending_seq,
                               (SELECT w.ready_seq FROM %1$s.workflow_status w
                                WHERE w.queue = fl.queue AND w.priority = fl.priority
                                  AND w.status = 'queued' AND w.ordering_key IS NOT NULL
                                  AND w.ready_seq >= fl.keyed_floor_seq
                                ORDER BY w.ready_seq LIMIT 1))) AS new_keyed_floor_seq
                    FROM %1$s.shardq_ready_floors fl
                ), risen AS MATERIALIZED (
                    SELECT * FROM moved
                    WHERE new_floor_seq > floor_seq OR new_keyed_floor_seq > keyed_floor_seq
                ), added AS (
                    INSERT INTO %1$s.shardq_ready_floor_moves
                        (queue, priority, move_seq, floor_seq, keyed_floor_seq)
                    SELECT r.queue, r.priority, s, r.new_floor_seq, r.new_keyed_floor_seq FROM risen r
                )
                -- Each replaced row found by its key: joined to the rows to delete,
                -- the planner walked the whole key, every row a hold keeps, once
                -- statistics showed few live rows.
                DELETE FROM %1$s.shardq_ready_floor_moves d
                WHERE d.ctid = ANY (ARRAY(
                    SELECT (SELECT f.ctid FROM %1$s.shardq_ready_floor_moves f
                            WHERE f.queue = r.queue AND f.priority = r.priority
                              AND f.move_seq = r.move_seq)
                    FROM risen r));
            END IF;
            -- The grouped rounds, behind the same barrier (migration 0041).
            PERFORM %1$s.shardq_move_group_rounds(s, passed);
            -- Deleted, then added: this text also runs on the table as migration
            -- 0047 left it (one_row its key; pending_seq NULL before any move),
            -- between the migration whose transaction applies the functions (0047,
            -- or 0048 on a shard at 47) and 0049.
            IF b.pending_seq IS NULL THEN
                DELETE FROM %1$s.shardq_ready_barrier r WHERE r.pending_seq IS NULL;
            ELSE
                DELETE FROM %1$s.shardq_ready_barrier r WHERE r.pending_seq = b.pending_seq;
            END IF;
            INSERT INTO %1$s.shardq_ready_barrier (pending_seq, pending_xid, advanced_at)
                VALUES (s, x, clock_timestamp());
        END
        $b$
    $f$, s);
END $$;
