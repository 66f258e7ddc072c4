-- shardq_cascades_paid: drops the cancel cascades owed by the workflows
-- given pairwise (shard keys, ids), once a cascade over all their
-- children reached every child. Called by the canceller after its
-- cascade, and by the workers' pass.
--
-- SECURITY DEFINER, as shardq_owe_cascades: a producer or the dashboard
-- needs no right on shardq_cascades_owed.
DO $$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'workflow_status'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_cascades_paid(p_keys int[], p_ids bigint[])
        RETURNS void
        LANGUAGE sql SECURITY DEFINER
        AS $b$
            DELETE FROM %1$s.shardq_cascades_owed o
            USING unnest(p_keys, p_ids) AS p(k, i)
            WHERE o.shard_key = p.k AND o.id = p.i;
        $b$
    $f$, s);
END $$;
