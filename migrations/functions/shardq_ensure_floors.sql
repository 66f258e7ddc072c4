-- shardq_ensure_floors: makes the ready floors of the queues and
-- priorities given pairwise, where missing: their rows of the
-- never-updated shardq_ready_levels (a floor with no row in
-- shardq_ready_floor_moves is 0, migration 0047). The client calls it on its own before
-- the first job of a queue and priority it writes to a shard
-- (src/store/floors.rs), so the trigger that numbers the job finds the
-- floors made and inserts nothing in the enqueuing transaction: a second
-- transaction enqueueing into the same new queue and priority then does
-- not wait for the first to commit. The trigger (shardq_mark_ready) calls
-- it too, for a job whose floors are missing (one written by SQL).
--
-- SECURITY DEFINER, as shardq_mark_ready: a producer needs no right on
-- the floors. Its tables are schema-qualified (resolved now, from
-- workflow_status, which is why it is created by a DO block), and its
-- search_path is fixed (it runs seldom: once per queue and priority), so
-- no name in it, now or after a change, resolves to a caller's object
-- run with the owner's rights.
DO $$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'workflow_status'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_ensure_floors(p_queues text[], p_priorities int[])
        RETURNS void
        LANGUAGE sql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $b$
            INSERT INTO %1$s.shardq_ready_levels (queue, priority)
            SELECT q, p FROM unnest(p_queues, p_priorities) AS t(q, p)
            ON CONFLICT DO NOTHING;
        $b$
    $f$, s);
END $$;
