-- shardq_reserve_ids: ids for an enqueue, taken before its insert: a retried
-- insert with the same ids is idempotent under the primary key (ON CONFLICT
-- DO NOTHING), so an enqueue whose reply was lost can be sent again without
-- writing its jobs twice, and without a token column or a new index on
-- workflow_status.
--
-- The ids come from the table's own identity sequence, so they still grow in
-- the order enqueues are made: a call that returned before another began
-- holds smaller ids, which is all per-key order needs (a key's jobs run in id
-- order among those committed when the key is taken).
--
-- SECURITY DEFINER: `nextval` needs a privilege on the sequence that a role
-- allowed to insert jobs does not have (an identity column needs none,
-- docs/least_privilege.sql); this function lends only that. Every name in it
-- is schema-qualified (the sequence is resolved now, from the identity
-- column, which is why the function is created by a DO block), so the
-- caller's search_path cannot redirect it; a `SET search_path` clause would
-- do the same at a cost on every call. plpgsql keeps its plan per
-- connection; one array, not a set, comes back.
DO $$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_reserve_ids(p_n int) RETURNS bigint[]
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER
        AS $b$
        BEGIN
            RETURN ARRAY(SELECT pg_catalog.nextval(%L::pg_catalog.regclass)
                         FROM pg_catalog.generate_series(1, p_n));
        END
        $b$
    $f$, pg_get_serial_sequence('workflow_status', 'id'));
END $$;
