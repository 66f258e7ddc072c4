-- shardq_owe_cascades: records that the workflows given pairwise (shard
-- keys, ids), just cancelled or ended by their deadline, owe their
-- children a cancel cascade (shardq_cascades_owed, migration 0040), due
-- for the workers' pass in 10 s should their canceller not pay it first.
-- Called by the cancel and the deadline pass in the statement that ends
-- them (holding their rows' locks), so the debt commits with the cancel.
-- A workflow that owes one already (cancelled again after a retry, or
-- its running children asked again by a pass) gets the new generation
-- and keeps its first `owed_since`, which `shardq check` judges. Returns the greatest generation written (0: none):
-- what the caller pays once its cascade reached every child.
--
-- SECURITY DEFINER: a producer or the dashboard cancels without a right
-- on the table, so a role not granted it after an upgrade still cancels.
-- Anyone may call it: a debt written for a workflow that is not
-- cancelled is paid by the workers' pass without a cascade, and a debt
-- owed again keeps its earlier due time, so calling it again and again
-- cannot put off the pass's cascade of a canceller that died. Its
-- search_path is fixed, and the table named with its schema (resolved
-- when it is created, from workflow_status, hence the DO block).
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
        SET search_path = pg_catalog, pg_temp
        AS $b$
            WITH written AS (
                INSERT INTO %1$s.shardq_cascades_owed AS o (shard_key, id, generation, due_at)
                SELECT t.k, t.i, nextval('%1$s.shardq_cascades_owed_generation'),
                       now() + interval '10 seconds'
                FROM unnest(p_keys, p_ids) AS t(k, i)
                ON CONFLICT (shard_key, id) DO UPDATE
                    SET generation = EXCLUDED.generation,
                        due_at = least(o.due_at, EXCLUDED.due_at)
                RETURNING generation)
            SELECT coalesce(max(generation), 0) FROM written;
        $b$
    $f$, s);
END $$;
