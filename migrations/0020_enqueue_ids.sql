-- Ids for an enqueue, taken before its insert: a retried insert with the same
-- ids is idempotent under the primary key (ON CONFLICT DO NOTHING), so an
-- enqueue whose reply was lost can be sent again without writing its jobs
-- twice, and without a token column or a new index on workflow_status.
--
-- The ids come from the table's own identity sequence, so they still grow
-- in the order enqueues are made: a call that returned before another began
-- holds smaller ids, which is all per-key order needs (migration 4: a key's
-- jobs run in id order among those committed when the key is taken).
--
-- SECURITY DEFINER: `nextval` needs a privilege on the sequence that a role
-- allowed to insert jobs does not have (an identity column needs none,
-- docs/least_privilege.sql); this function lends only that. The sequence is
-- named by the identity column itself, resolved now, schema-qualified.
DO $$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_reserve_ids(p_n int) RETURNS SETOF bigint
        LANGUAGE sql VOLATILE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $b$SELECT nextval(%L::regclass) FROM generate_series(1, p_n)$b$
    $f$, pg_get_serial_sequence('workflow_status', 'id'));
END $$;
