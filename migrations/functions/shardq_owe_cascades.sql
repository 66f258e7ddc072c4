-- shardq_owe_cascades: records that the workflows given pairwise (shard
-- keys, ids), just cancelled or ended by their deadline, owe their
-- children a cancel cascade (shardq_cascades_owed, migration 0040), due
-- for the workers' pass in 10 s should their canceller not pay it first.
-- Called by the cancel and the deadline pass in the statement that ends
-- them, so the debt commits with the cancel. Returns how many it wrote.
--
-- SECURITY DEFINER: a producer or the dashboard cancels without a right
-- on the table, so a role not granted it after an upgrade still cancels.
-- Every name in it is schema-qualified (resolved now, from
-- workflow_status, which is why it is created by a DO block).
DO $$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'workflow_status'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_owe_cascades(p_keys int[], p_ids bigint[])
        RETURNS bigint
        LANGUAGE sql SECURITY DEFINER
        AS $b$
            WITH written AS (
                INSERT INTO %1$s.shardq_cascades_owed (shard_key, id, due_at)
                SELECT k, i, now() + interval '10 seconds'
                FROM unnest(p_keys, p_ids) AS t(k, i)
                ON CONFLICT (shard_key, id) DO NOTHING
                RETURNING 1)
            SELECT count(*) FROM written;
        $b$
    $f$, s);
END $$;
