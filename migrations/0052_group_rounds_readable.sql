-- The grouped floors readable by every role that reads the jobs.
--
-- The backlog read (`shardq status`, `shardq metrics`, Client::depth, the
-- dashboard) counted each queue's grouped ready jobs from the start of
-- workflow_status_ready_grouped. While a long transaction holds the xmin
-- horizon, that index keeps an entry for the ready version of every
-- grouped job claimed since, and the count walked them all: at 10,000
-- jobs a second, millions of entries after ten minutes, and the exporter
-- reported the shard down. It now counts each queue's from its grouped
-- floor (shardq_group_rounds, where the claims walk from), so every role
-- that reads the backlog (a producer's too, which could not read the
-- rounds) needs to read that view: the roles that may read the jobs may
-- read it. The view reads its tables with its owner's rights, through
-- shardq_group_round_of, which every role may execute (a server that
-- revoked EXECUTE on functions from PUBLIC must grant it to these roles).
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                  ELSE a.grantee::regrole::text END AS role
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = 'workflow_status'::regclass
               AND a.grantee <> c.relowner AND a.privilege_type = 'SELECT' LOOP
        EXECUTE format('GRANT SELECT ON TABLE shardq_group_rounds TO %s', r.role);
    END LOOP;
END $$;
