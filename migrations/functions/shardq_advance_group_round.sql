-- shardq_advance_group_round: moves p_queue's rounds (shardq_group_rounds,
-- migration 0041) and returns the queue's grouped floor: the turn a
-- grouped claim walks from. Called by the grouped claim before it locks
-- any job; moves at most every 250 ms, by one caller at a time (the others
-- return the floor they read and go on: SKIP LOCKED). The first claim of
-- a queue makes its row.
--
-- A move:
-- 1. locks the row (the newest version: its round was committed before
--    the next statement's snapshot), then reads that snapshot's xmax X:
--    every transaction id below X was given before. A producer that read
--    an older round took its id before it read (shardq_take_turn), so
--    before the newer round was committed: its id is below X;
-- 2. asks whether the barrier noted by an earlier move has passed: no
--    transaction with an id below its X still runs. Then every producer
--    that read a round below the noted one has ended: every turn below
--    the noted round is written and visible, or never will be;
-- 3. then (a later snapshot, which sees what those producers committed)
--    walks the grouped ready index from the floor to the first ready turn:
--    it passes only what was claimed since the floor last moved;
-- 4. when the barrier passed, moves the floor to the lower of the noted
--    round and that first ready turn, and notes a new barrier: the round
--    read in 1, and X;
-- 5. moves the round up to that first ready turn, or, when no grouped job
--    is ready, to a fresh number of shardq_ready_seq, at or past every
--    turn given (shardq_take_turn says why);
-- 6. gives the round as turn to ready grouped jobs without one (those of
--    REPEATABLE READ or SERIALIZABLE producers, and an upgrade's
--    stragglers: shardq_queue_has_ready finds them), skipping rows others
--    hold: a probe of the end of the index, usually empty.
-- It needs no transaction id of its own, so a claim that already has one
-- (it moved the ready floors) moves the rounds too. Under an isolation
-- above READ COMMITTED (not a worker's claim) it only reads the floor.
--
-- SECURITY DEFINER with a fixed search_path: a worker role not granted the
-- table (docs/least_privilege.sql not run again after `migrate`) still
-- claims grouped jobs.
DO $$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'workflow_status'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_advance_group_round(p_queue text)
        RETURNS bigint
        LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        SET plan_cache_mode = force_generic_plan
        AS $b$
        DECLARE
            r %1$s.shardq_group_rounds%%ROWTYPE;
            seen_floor bigint := 0;
            x xid8;
            passed boolean;
            first_ready bigint;
            new_floor bigint;
        BEGIN
            SELECT * INTO r FROM %1$s.shardq_group_rounds g WHERE g.queue = p_queue;
            IF FOUND THEN
                seen_floor := r.floor_turn;
                IF r.moved_at > clock_timestamp() - interval '250 milliseconds'
                   OR current_setting('transaction_isolation') <> 'read committed' THEN
                    RETURN seen_floor;
                END IF;
                SELECT * INTO r FROM %1$s.shardq_group_rounds g WHERE g.queue = p_queue
                FOR NO KEY UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    RETURN seen_floor;         -- another claim is moving it
                ELSIF r.moved_at > clock_timestamp() - interval '250 milliseconds' THEN
                    RETURN r.floor_turn;       -- one just did
                END IF;
            ELSE
                IF current_setting('transaction_isolation') <> 'read committed' THEN
                    RETURN 0;
                END IF;
                INSERT INTO %1$s.shardq_group_rounds AS g (queue) VALUES (p_queue)
                ON CONFLICT DO NOTHING RETURNING g.* INTO r;
                IF NOT FOUND THEN
                    RETURN 0;                  -- another claim made it
                END IF;
            END IF;
            x := pg_snapshot_xmax(pg_current_snapshot());
            passed := r.noted_xid IS NULL
                OR pg_snapshot_xmin(pg_current_snapshot()) >= r.noted_xid;
            first_ready := (SELECT w.turn FROM %1$s.workflow_status w
                            WHERE w.queue = p_queue AND w.status = 'queued'
                              AND w.job_group IS NOT NULL AND w.turn >= r.floor_turn
                            ORDER BY w.turn LIMIT 1);
            new_floor := r.floor_turn;
            IF passed THEN
                IF r.noted_xid IS NOT NULL THEN
                    new_floor := greatest(r.floor_turn,
                                          least(r.noted_round, coalesce(first_ready, r.noted_round)));
                END IF;
                r.noted_round := r.round;
                r.noted_xid := x;
            END IF;
            r.round := greatest(r.round, coalesce(first_ready, nextval('%1$s.shardq_ready_seq')));
            UPDATE %1$s.shardq_group_rounds g
            SET round = r.round, floor_turn = new_floor, noted_round = r.noted_round,
                noted_xid = r.noted_xid, moved_at = clock_timestamp()
            WHERE g.queue = p_queue;
            UPDATE %1$s.workflow_status w SET turn = r.round
            WHERE w.ctid = ANY (ARRAY(
                SELECT u.ctid FROM %1$s.workflow_status u
                WHERE u.queue = p_queue AND u.status = 'queued' AND u.job_group IS NOT NULL
                  AND u.turn IS NULL
                FOR UPDATE SKIP LOCKED));
            RETURN new_floor;
        END
        $b$
    $f$, s);
END $$;
