-- shardq_cascades_paid: drops the cancel cascades owed by the workflows
-- given (shard keys, ids, and each one's generation the payer read before
-- its cascade started), once that cascade reached every child. A debt of
-- a later cancel (a greater generation) stays. Called by the canceller
-- after its cascade, and by the workers' pass.
--
-- SECURITY DEFINER, as shardq_owe_cascades: a producer or the dashboard
-- needs no right on shardq_cascades_owed. Not callable by everyone (a
-- debt dropped unpaid is a cancel not carried out): the owner grants it
-- (docs/least_privilege.sql).
DO $$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'workflow_status'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_cascades_paid(p_keys int[], p_ids bigint[],
                                                        p_generations bigint[])
        RETURNS bigint
        LANGUAGE sql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $b$
            WITH paid AS (
                DELETE FROM %1$s.shardq_cascades_owed o
                USING unnest(p_keys, p_ids, p_generations) AS p(k, i, g)
                WHERE o.shard_key = p.k AND o.id = p.i AND o.generation <= p.g
                RETURNING 1)
            SELECT count(*) FROM paid;
        $b$
    $f$, s);
    REVOKE EXECUTE ON FUNCTION shardq_cascades_paid(int[], bigint[], bigint[]) FROM PUBLIC;
END $$;
