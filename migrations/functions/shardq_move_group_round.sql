-- shardq_move_group_round: moves p_queue's round (shardq_group_rounds,
-- migration 0041) up to p_turn, the lowest turn a grouped claim just took:
-- a new group's first job joins the round there (shardq_take_turn). Each
-- move is a row version, all kept while the horizon is held, and every
-- grouped enqueue reads the row: so at most one move every 250 ms, and a
-- claim never waits on another's move (SKIP LOCKED). The round never goes
-- down. The first claim of a queue writes its row.
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
        CREATE OR REPLACE FUNCTION shardq_move_group_round(p_queue text, p_turn bigint)
        RETURNS void
        LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        SET plan_cache_mode = force_generic_plan
        AS $b$
        DECLARE
            now_at %1$s.shardq_group_rounds%%ROWTYPE;
        BEGIN
            SELECT * INTO now_at FROM %1$s.shardq_group_rounds r WHERE r.queue = p_queue;
            IF NOT FOUND THEN
                INSERT INTO %1$s.shardq_group_rounds (queue, round) VALUES (p_queue, p_turn)
                ON CONFLICT DO NOTHING;
            ELSIF now_at.round < p_turn
                  AND now_at.moved_at < clock_timestamp() - interval '250 milliseconds' THEN
                UPDATE %1$s.shardq_group_rounds r
                SET round = p_turn, moved_at = clock_timestamp()
                WHERE r.queue = (SELECT l.queue FROM %1$s.shardq_group_rounds l
                                 WHERE l.queue = p_queue AND l.round < p_turn
                                 FOR UPDATE SKIP LOCKED);
            END IF;
        END
        $b$
    $f$, s);
END $$;
