-- shardq_group_floor: p_queue's grouped floor (shardq_group_rounds,
-- migration 0041), the turn its grouped claims walk from; the first claim
-- of a queue makes its row (in shardq_group_queues, migration 0047: its
-- rounds start at 0, every turn at or past them), which
-- shardq_move_group_rounds moves from then on (and numbers the queue's
-- grouped jobs left without a turn from). Claims with and without group
-- limits ask it. A claim that finds another transaction making the row
-- goes on without it instead of waiting for that transaction to end (its
-- advisory lock, tried): the next claim makes it.
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
        CREATE OR REPLACE FUNCTION shardq_group_floor(p_queue text)
        RETURNS bigint
        LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        SET plan_cache_mode = force_generic_plan
        AS $b$
        DECLARE
            floor_now bigint;
        BEGIN
            SELECT g.floor_turn INTO floor_now FROM %1$s.shardq_group_rounds g
            WHERE g.queue = p_queue;
            IF NOT FOUND THEN
                IF pg_try_advisory_xact_lock(
                        hashtextextended('shardq_group_rounds' || chr(31) || p_queue, 8)) THEN
                    INSERT INTO %1$s.shardq_group_queues (queue) VALUES (p_queue)
                    ON CONFLICT DO NOTHING;
                END IF;
                RETURN 0;
            END IF;
            RETURN floor_now;
        END
        $b$
    $f$, s);
END $$;
