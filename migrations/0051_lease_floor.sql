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
-- A lease recovery pass that caught up writes, in its own transaction,
-- the time below which no running job's lease now ends: the earliest
-- expired lease it had to leave (a busy key or row) or saw still running,
-- else its own time less a margin (a claim still open then is seen only
-- later, with a lease no earlier than its start). A lease written after
-- it ends later (a claim or an extension sets `now()` plus its length).
-- Readers bound their walk of the running jobs below by the newest row;
-- the next pass starts there. Passes are one at a time per shard (the
-- recovery's advisory lock), which numbers the rows; each deletes the
-- rows before its own, and a read takes the newest, the first in a
-- backward walk of the primary key however many replaced ones a hold
-- keeps (migration 0047's reason).
CREATE TABLE shardq_lease_floor_moves (
    move_seq bigint PRIMARY KEY,
    floor_at timestamptz NOT NULL,
    moved_at timestamptz NOT NULL DEFAULT now()
);

-- The roles that could recover leases (they update workflow_status) may
-- move the floor; those that may read workflow_status may read it.
DO $$
DECLARE
    r record;
BEGIN
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
