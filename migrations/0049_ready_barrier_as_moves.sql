-- The ready floors' barrier as rows that are only added and deleted.
--
-- Each move of the ready floors (shardq_advance_ready_floors, up to 4 a
-- second while claims poll) updated the barrier's one row, and the next
-- move read it. While a long transaction holds the horizon none of its
-- versions can be removed, and a read of the row walks all of them, so
-- each move took longer than the last, inside the claim that made it
-- (migration 0047 did the same for the floors themselves).
--
-- Now a move deletes the row it read and adds its own, keyed by the
-- number it took (pending_seq, from shardq_ready_seq: past every earlier
-- move's), and the next move reads the row with the highest number, the
-- first in a backward walk of the primary key, however many replaced ones
-- a held horizon keeps behind it. The row of a shard whose floors never
-- moved gets 0 (its pending_xid stays NULL: nothing to wait for).
--
-- The functions of this release also run on the table as 0047 left it
-- (0047, or 0048 on a shard at 47, applies them in its own transaction,
-- before this one). The movers' lock is taken
-- first, so no move runs while the table is replaced (a new table, its
-- row copied, its owner and grants too); the DROP waits at most 2 s for
-- its lock (a pg_dump holding the table), and the migration then fails,
-- nothing changed, to be run again. The roles that could update the
-- barrier (the worker's claims move the floors) may now add and delete
-- its rows.
SELECT pg_advisory_xact_lock(hashtext('shardq_ready_floors')::bigint);
SET LOCAL lock_timeout = '2s';

CREATE TABLE shardq_ready_barrier_next (
    pending_seq bigint PRIMARY KEY,
    pending_xid xid8,
    advanced_at timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO shardq_ready_barrier_next (pending_seq, pending_xid, advanced_at)
SELECT coalesce(pending_seq, 0), pending_xid, advanced_at FROM shardq_ready_barrier;

DO $$
DECLARE
    owner text := (SELECT c.relowner::regrole::text FROM pg_class c
                   WHERE c.oid = 'shardq_ready_barrier'::regclass);
    r record;
BEGIN
    EXECUTE format('ALTER TABLE shardq_ready_barrier_next OWNER TO %s', owner);
    FOR r IN SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                  ELSE a.grantee::regrole::text END AS role,
                    a.privilege_type
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = 'shardq_ready_barrier'::regclass
               AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT %s ON TABLE shardq_ready_barrier_next TO %s',
                       r.privilege_type, r.role);
        IF r.privilege_type = 'UPDATE' THEN
            EXECUTE format('GRANT INSERT, DELETE ON TABLE shardq_ready_barrier_next TO %s',
                           r.role);
        END IF;
    END LOOP;
END $$;

DROP TABLE shardq_ready_barrier;
ALTER TABLE shardq_ready_barrier_next RENAME TO shardq_ready_barrier;
ALTER INDEX shardq_ready_barrier_next_pkey RENAME TO shardq_ready_barrier_pkey;

-- The permit leases' old table, left empty by 0048 (its rows moved to
-- shardq_limit_holders and shardq_limit_lease_moves).
DROP TABLE IF EXISTS shardq_limit_leases;
