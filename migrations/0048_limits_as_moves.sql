-- shardq:functions-with-this
-- A queue rate's token bucket and its permit leases as rows that are only
-- added and deleted.
--
-- Each take of starts from a rate (shardq_take_starts: several per claim
-- of a rate-limited queue, tens a second at high rates) updated the
-- bucket's two columns in the queue's limits row, and every ask read that
-- row, as does every renewal of the queue's permits. While a long
-- transaction holds the horizon none of its versions can be removed, and
-- a read of the row walks all of them: 2.4 ms a take after 50,000 takes
-- held, 0.3 at the start (bench/experiments/limits_versions.py), growing
-- with every take.
--
-- Now a take adds the bucket's new row, numbered one past the row it read
-- (take_seq), and deletes that row; an ask reads the newest, the first in
-- a backward walk of the key. The limits row is no longer written by
-- takes: its tokens and tokens_at stay as the bucket's state before the
-- first take since this migration (a queue without a bucket row reads
-- them, so nothing is copied here). Takers still lock the limits row (a
-- lock writes no version) to take one after the other.
--
-- A process's lease of a queue's permits (shardq_lease_permits, renewed
-- every 500 ms by every process) was one row, upserted, and each renewal
-- read every holder's row of the queue: held, every version of every
-- holder's row (1.9 ms a renewal after 7,200 renewals of 8 processes, 0.3
-- at the start). Now each holder of a queue has a row written once
-- (shardq_limit_holders, deleted when its lease lapses) and each renewal
-- adds the holder's lease row numbered past its newest and deletes that
-- one (shardq_limit_lease_moves); readers take each holder's newest. The
-- leases are copied under the limits rows' locks, which every grant takes
-- first, and the old table is left empty (dropped by 0049).
--
-- The functions of this release commit with this migration (its first
-- line): the old lease function would write the old table after the copy.
--
-- The roles that could update the limits row (the worker's takes wrote
-- the bucket there) may add and delete the bucket's rows; those that
-- could write the leases may write the new tables, and those that could
-- read them may read the new ones.
CREATE TABLE shardq_rate_buckets (
    queue text NOT NULL,
    take_seq bigint NOT NULL,
    tokens double precision NOT NULL,
    tokens_at timestamptz NOT NULL,
    PRIMARY KEY (queue, take_seq)
);

DO $$
DECLARE
    owner text := (SELECT c.relowner::regrole::text FROM pg_class c
                   WHERE c.oid = 'shardq_queue_limits'::regclass);
    r record;
BEGIN
    EXECUTE format('ALTER TABLE shardq_rate_buckets OWNER TO %s', owner);
    FOR r IN SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                  ELSE a.grantee::regrole::text END AS role
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = 'shardq_queue_limits'::regclass
               AND a.grantee <> c.relowner AND a.privilege_type = 'UPDATE' LOOP
        EXECUTE format('GRANT SELECT, INSERT, DELETE ON TABLE shardq_rate_buckets TO %s',
                       r.role);
    END LOOP;
END $$;

CREATE TABLE shardq_limit_holders (
    queue text NOT NULL,
    holder text NOT NULL,
    PRIMARY KEY (queue, holder)
);
CREATE TABLE shardq_limit_lease_moves (
    queue text NOT NULL,
    holder text NOT NULL,
    renewal_seq bigint NOT NULL,
    permits integer NOT NULL CHECK (permits >= 0),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue, holder, renewal_seq)
);

-- No grant between the copy and the functions' commit: each takes the
-- queue's limits row first.
SELECT count(*) FROM (SELECT 1 FROM shardq_queue_limits FOR UPDATE) locked;
INSERT INTO shardq_limit_holders (queue, holder)
SELECT queue, holder FROM shardq_limit_leases;
INSERT INTO shardq_limit_lease_moves (queue, holder, renewal_seq, permits, expires_at)
SELECT queue, holder, 1, permits, expires_at FROM shardq_limit_leases;
DELETE FROM shardq_limit_leases;

DO $$
DECLARE
    owner text := (SELECT c.relowner::regrole::text FROM pg_class c
                   WHERE c.oid = 'shardq_limit_leases'::regclass);
    r record;
BEGIN
    EXECUTE format('ALTER TABLE shardq_limit_holders OWNER TO %s', owner);
    EXECUTE format('ALTER TABLE shardq_limit_lease_moves OWNER TO %s', owner);
    FOR r IN SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                  ELSE a.grantee::regrole::text END AS role,
                    a.privilege_type
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = 'shardq_limit_leases'::regclass
               AND a.grantee <> c.relowner
               AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE') LOOP
        IF r.privilege_type = 'SELECT' THEN
            EXECUTE format('GRANT SELECT ON TABLE shardq_limit_holders, '
                           'shardq_limit_lease_moves TO %s', r.role);
        ELSE
            EXECUTE format('GRANT SELECT, INSERT, DELETE ON TABLE shardq_limit_holders, '
                           'shardq_limit_lease_moves TO %s', r.role);
        END IF;
    END LOOP;
END $$;
