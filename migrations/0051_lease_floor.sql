-- The lease floor: no running job's lease ends before it.
--
-- While a long transaction holds the xmin horizon, the lease index
-- (workflow_status_lease) keeps an entry for the running version of every
-- job finished since, and every read of the running jobs walks them all:
-- the backlog's running count (`shardq status`, `shardq metrics`,
-- Client::depth) and `shardq check`'s windows of running rows. At 10,000
-- jobs a second that is 6 million entries after ten minutes, and the
-- exporter reported the shard down.
--
-- Upkeep moves the floor (each worker about once a second, one at a
-- time per shard), in two steps. A move notes a candidate: its own time
-- (`pending_at`, its transaction's `now()`) and its transaction's id
-- (`pending_xid`, taken after that time; ids are taken in order). A later
-- move, once the candidate is a few seconds old and every transaction
-- with a lower id has ended, makes it the floor, or the earliest lease
-- at or past the old floor and before it still running, whichever is
-- earlier. Every job claimed or extended by a transaction with a lower
-- id is visible to that read; one with a higher id took it after the
-- candidate's time, and writes a lease that ends later still (a claim or
-- an extension locks its rows, which takes its id, then writes the clock
-- at that moment plus the lease's length, at least 1 ms). So an open
-- claim holds the floor back until it ends, however long it runs, as any
-- open transaction that took an id on the server does (an open writer
-- holds the ready floors likewise: migration 0049); the reads are then
-- still right, and walk more. The argument takes the database's clock
-- not to step back by more than a lease.
--
-- Readers bound their walk of the running jobs below by the newest row's
-- `floor_at` (NULL: none yet, every lease); lease recovery starts there
-- too. The moves' upkeep lock numbers the rows; each move deletes the
-- rows before its own, and a read takes the newest, the first in a
-- backward walk of the primary key however many replaced ones a hold
-- keeps (migration 0047's reason).
CREATE TABLE shardq_lease_floor_moves (
    move_seq bigint PRIMARY KEY,
    floor_at timestamptz,
    pending_at timestamptz NOT NULL,
    pending_xid xid8 NOT NULL,
    moved_at timestamptz NOT NULL DEFAULT now()
);

-- Owned as the jobs' table is (whoever ran the migration, a superuser
-- say, may not be the role the shard's tables belong to). The roles that
-- may read the jobs may read it; those that may delete them (a worker's,
-- whose upkeep moves the floor; not a producer's) may add and delete its
-- rows.
DO $$
DECLARE
    owner text := (SELECT c.relowner::regrole::text FROM pg_class c
                   WHERE c.oid = 'workflow_status'::regclass);
    r record;
BEGIN
    EXECUTE format('ALTER TABLE shardq_lease_floor_moves OWNER TO %s', owner);
    FOR r IN SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                  ELSE a.grantee::regrole::text END AS role,
                    a.privilege_type
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = 'workflow_status'::regclass
               AND a.grantee <> c.relowner
               AND a.privilege_type IN ('SELECT', 'DELETE') LOOP
        IF r.privilege_type = 'SELECT' THEN
            EXECUTE format('GRANT SELECT ON TABLE shardq_lease_floor_moves TO %s', r.role);
        ELSE
            EXECUTE format('GRANT INSERT, DELETE ON TABLE shardq_lease_floor_moves TO %s',
                           r.role);
        END IF;
    END LOOP;
END $$;
