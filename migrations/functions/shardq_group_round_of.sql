-- shardq_group_round_of: a grouped queue's rounds (its round, grouped
-- floor and noted round: migration 0041), read from their newest row in
-- shardq_group_round_moves (migration 0047: each move of the rounds adds
-- the queue's new row and deletes the one it replaces), and the view
-- shardq_group_rounds that every reader of the rounds reads, one call per
-- queue of shardq_group_queues (a queue without a row: round and floor 0,
-- no noted round). As shardq_ready_floor_of, which says why the plan is
-- fixed and why it is SECURITY DEFINER; migration 0047 made the view with
-- the same read inline, for the moment before this text is applied.
DO $$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'workflow_status'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_group_round_of(p_queue text,
            OUT round bigint, OUT floor_turn bigint, OUT noted_round bigint, OUT move_seq bigint)
        LANGUAGE plpgsql STABLE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        SET enable_bitmapscan = off
        SET enable_seqscan = off
        SET plan_cache_mode = force_generic_plan
        AS $b$
        BEGIN
            SELECT r.round, r.floor_turn, r.noted_round, r.move_seq
            INTO round, floor_turn, noted_round, move_seq
            FROM %1$s.shardq_group_round_moves r
            WHERE r.queue = p_queue
            ORDER BY r.move_seq DESC LIMIT 1;
        END
        $b$
    $f$, s);
    EXECUTE format($f$
        CREATE OR REPLACE VIEW %1$s.shardq_group_rounds AS
        SELECT q.queue,
               coalesce(m.round, 0) AS round,
               coalesce(m.floor_turn, 0) AS floor_turn,
               m.noted_round,
               m.move_seq
        FROM %1$s.shardq_group_queues q
        CROSS JOIN LATERAL %1$s.shardq_group_round_of(q.queue) m
    $f$, s);
END $$;
