-- shardq_advance_group_round: moves p_queue's rounds (shardq_group_rounds,
-- migration 0041) and returns the queue's grouped floor: the turn a
-- grouped claim walks from. Called by the grouped claim before it locks
-- anything; moves at most every 250 ms, by one caller at a time (the
-- others return the floor they read and go on: SKIP LOCKED).
--
-- A move:
-- 1. reads and locks the row (its snapshot sees the round committed so
--    far), then takes a transaction id X (after that commit);
-- 2. asks whether the barrier noted by an earlier move has passed: no
--    transaction older than its id still runs. Every producer that read a
--    round below the noted one took its id before (shardq_take_turn takes
--    it before it reads), so it has ended: every turn below the noted
--    round is written and visible, or never will be;
-- 3. then (a later snapshot, which sees what those producers committed)
--    walks the grouped ready index from the floor to the first ready turn:
--    it passes only what was claimed since the floor last moved;
-- 4. when the barrier passed, moves the floor to the lower of the noted
--    round and that first ready turn, and notes a new barrier: the round
--    read in 1, and X;
-- 5. moves the round up to that first ready turn, or, when no grouped job
--    is ready, to a fresh number of shardq_ready_seq, which is past every
--    turn given (shardq_take_turn says why);
-- 6. gives a turn (the round) to any ready grouped job still without one
--    (an upgrade's stragglers: migrations/functions/shardq_take_turn.sql
--    numbers them too, leaving those a claim held), skipping rows others
--    hold: a probe of the end of the index, usually empty.
-- A transaction that already has an id (it wrote before) does not move
-- the rounds: X must come after the round it read.
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
            seen_floor bigint;
            x xid8;
            passed boolean;
            first_ready bigint;
            new_floor bigint;
        BEGIN
            SELECT * INTO r FROM %1$s.shardq_group_rounds g WHERE g.queue = p_queue;
            IF NOT FOUND THEN
                INSERT INTO %1$s.shardq_group_rounds (queue) VALUES (p_queue)
                ON CONFLICT DO NOTHING;
                RETURN 0;
            END IF;
            seen_floor := r.floor_turn;
            IF r.moved_at > clock_timestamp() - interval '250 milliseconds'
               OR pg_current_xact_id_if_assigned() IS NOT NULL THEN
                RETURN seen_floor;
            END IF;
            SELECT * INTO r FROM %1$s.shardq_group_rounds g WHERE g.queue = p_queue
            FOR NO KEY UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                RETURN seen_floor;             -- another claim is moving it
            ELSIF r.moved_at > clock_timestamp() - interval '250 milliseconds' THEN
                RETURN r.floor_turn;           -- one just did
            END IF;
            x := pg_current_xact_id();
            passed := r.noted_xid IS NULL
                OR pg_snapshot_xmin(pg_current_snapshot()) > r.noted_xid;
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
