-- shardq_ready_floor_of: a queue and priority's ready floors, read from
-- their newest row in shardq_ready_floor_moves (migration 0047: a move
-- adds a floor's new row and deletes the one it replaces), and the view
-- shardq_ready_floors that every reader of the floors reads, one call per
-- queue and priority of shardq_ready_levels (a floor without a row is 0).
--
-- The newest row is the first a backward walk of the primary key meets;
-- the rows it replaced lie behind it, kept while a long transaction holds
-- the horizon. A bitmap scan would read them all (it cannot stop at the
-- first): once the table's statistics showed a few live rows over the
-- thousands of pages the kept ones fill, the planner took one for the
-- view's inline read (82 ms a move with 100 floors,
-- bench/experiments/floors_versions.py). Here the plan is fixed: no bitmap
-- or sequential scan, one generic plan per connection.
--
-- SECURITY DEFINER, so that a role that may read the view needs no right
-- on the rows (a function in a view runs as its caller). Every name in it
-- is schema-qualified (resolved now, from workflow_status, which is why it
-- is created by a DO block). Migration 0047 made the view with the same
-- read inline, for the moment before this text is applied.
DO $$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'workflow_status'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_ready_floor_of(p_queue text, p_priority int,
            OUT floor_seq bigint, OUT keyed_floor_seq bigint, OUT move_seq bigint)
        LANGUAGE plpgsql STABLE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        SET enable_bitmapscan = off
        SET enable_seqscan = off
        SET plan_cache_mode = force_generic_plan
        AS $b$
        BEGIN
            SELECT f.floor_seq, f.keyed_floor_seq, f.move_seq
            INTO floor_seq, keyed_floor_seq, move_seq
            FROM %1$s.shardq_ready_floor_moves f
            WHERE f.queue = p_queue AND f.priority = p_priority
            ORDER BY f.move_seq DESC LIMIT 1;
        END
        $b$
    $f$, s);
    EXECUTE format($f$
        CREATE OR REPLACE VIEW %1$s.shardq_ready_floors AS
        SELECT l.queue, l.priority,
               coalesce(m.floor_seq, 0) AS floor_seq,
               coalesce(m.keyed_floor_seq, 0) AS keyed_floor_seq,
               m.move_seq
        FROM %1$s.shardq_ready_levels l
        CROSS JOIN LATERAL %1$s.shardq_ready_floor_of(l.queue, l.priority) m
    $f$, s);
END $$;
