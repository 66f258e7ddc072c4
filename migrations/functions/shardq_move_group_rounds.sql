-- shardq_move_group_rounds: moves every queue's grouped rounds
-- (shardq_group_rounds, migration 0041; a view of shardq_group_round_moves
-- since 0047): called by
-- shardq_advance_ready_floors in each move of the ready floors, after it
-- took a number (p_fresh) and then its transaction id, with whether the
-- barrier of the move before has passed (p_passed: no transaction older
-- than that move's id still runs).
--
-- Only that mover writes the rows' rounds (under its lock, one move at a
-- time), so each round read here was committed by an earlier move, before
-- p_fresh was taken: a producer that read an older round took its number
-- after its transaction id and before it read (shardq_take_turn), so
-- before p_fresh, and its id is older than this move's.
-- 1. When the barrier passed: every producer that read a round below the
--    noted one (the round when that barrier was noted) has ended, and each
--    turn below it is written and visible, or never will be. The floor
--    moves to the lower of the noted round and the first ready turn at or
--    past the old floor (a walk that passes only what was claimed since
--    the floor last moved).
-- 2. The barrier this move leaves is noted with the round as it is now,
--    and the round moves up to the first ready turn, or, when no grouped
--    job is ready, to p_fresh: at or past every turn given
--    (shardq_take_turn says why). A queue whose rounds would not change
--    gets no new row; a queue with nothing ready still gets one a move, as
--    its round follows p_fresh (a row added, the one it replaces deleted:
--    readers meet the newest first, however many a held horizon keeps).
-- 3. Ready grouped jobs without a turn (written under REPEATABLE READ or
--    SERIALIZABLE, or before the upgrade's functions) get the new round,
--    at or past the floor; rows others hold are left for the next move.
--
-- SECURITY DEFINER with a fixed search_path: a worker role not granted the
-- table (docs/least_privilege.sql not run again after `migrate`) still
-- claims, and moves the ready floors. Not callable by everyone: only
-- shardq_advance_ready_floors (running as the owner) calls it, in the
-- order above. Called apart from that order, with a number of the
-- caller's choosing or p_passed true before the barrier passed, or noting
-- a round without the barrier that goes with it, it would let a grouped
-- floor pass a job a producer is still writing: no claim would reach it.
DO $$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'workflow_status'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_move_group_rounds(p_fresh bigint, p_passed boolean)
        RETURNS void
        LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        SET plan_cache_mode = force_generic_plan
        AS $b$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM %1$s.shardq_group_queues) THEN
                RETURN;                        -- no grouped claim on this shard yet
            END IF;
            -- 1 and 2 in one statement: each queue whose rounds change gets
            -- a new row, numbered by this move, and loses the one it
            -- replaces (migration 0047: no row is ever updated). One probe
            -- of the first ready turn serves both: the floor rises to at
            -- most that turn, so the first ready turn at or past the new
            -- floor is the same one.
            WITH probed AS (
                SELECT r.queue, r.move_seq, r.round, r.floor_turn, r.noted_round,
                       (SELECT w.turn FROM %1$s.workflow_status w
                        WHERE w.queue = r.queue AND w.status = 'queued'
                          AND w.job_group IS NOT NULL AND w.turn >= r.floor_turn
                        ORDER BY w.turn LIMIT 1) AS turn
                FROM %1$s.shardq_group_rounds r
            ), moved AS MATERIALIZED (
                SELECT p.queue, p.move_seq, p.round AS noted_round,
                       CASE WHEN p_passed AND p.noted_round IS NOT NULL
                            THEN greatest(p.floor_turn,
                                          least(p.noted_round, coalesce(p.turn, p.noted_round)))
                            ELSE p.floor_turn END AS floor_turn,
                       greatest(p.round, coalesce(p.turn, p_fresh)) AS round
                FROM probed p
                WHERE (p_passed AND p.noted_round IS NOT NULL
                       AND least(p.noted_round, coalesce(p.turn, p.noted_round)) > p.floor_turn)
                   OR p.noted_round IS DISTINCT FROM p.round
                   OR p.round < coalesce(p.turn, p_fresh)
            ), added AS (
                INSERT INTO %1$s.shardq_group_round_moves
                    (queue, move_seq, round, floor_turn, noted_round)
                SELECT m.queue, p_fresh, m.round, m.floor_turn, m.noted_round FROM moved m
            )
            -- Each replaced row found by its key (as the floors' move does:
            -- a join walked every row a hold keeps).
            DELETE FROM %1$s.shardq_group_round_moves d
            WHERE d.ctid = ANY (ARRAY(
                SELECT (SELECT o.ctid FROM %1$s.shardq_group_round_moves o
                        WHERE o.queue = m.queue AND o.move_seq = m.move_seq)
                FROM moved m));
            IF NOT EXISTS (
                    SELECT 1 FROM %1$s.shardq_group_queues q
                    CROSS JOIN LATERAL (
                        SELECT 1 FROM %1$s.workflow_status x
                        WHERE x.queue = q.queue AND x.status = 'queued'
                          AND x.job_group IS NOT NULL AND x.turn IS NULL
                        LIMIT 1) u) THEN
                RETURN;
            END IF;
            UPDATE %1$s.workflow_status w SET turn = g.round
            FROM %1$s.shardq_group_rounds g
            WHERE w.queue = g.queue AND w.ctid = ANY (ARRAY(
                SELECT u.ctid FROM %1$s.shardq_group_queues q
                CROSS JOIN LATERAL (
                    SELECT x.ctid FROM %1$s.workflow_status x
                    WHERE x.queue = q.queue AND x.status = 'queued'
                      AND x.job_group IS NOT NULL AND x.turn IS NULL
                    FOR UPDATE OF x SKIP LOCKED) u));
        END
        $b$
    $f$, s);
    REVOKE EXECUTE ON FUNCTION shardq_move_group_rounds(bigint, boolean) FROM PUBLIC;
END $$;
