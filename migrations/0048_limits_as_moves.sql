-- shardq:functions-with-this
-- A queue rate's token bucket and its permit leases as rows that are only
-- added and deleted.
--
-- Each take of starts from a rate (shardq_take_starts: several per claim
-- of a rate-limited queue, tens a second at high rates) updated the
-- bucket's two columns in the queue's limits row, and every ask read that
-- row, as does every renewal of the queue's permits. While a long
-- transaction holds the horizon none of its versions can be removed, and
-- a read of the row walks all of them: 2.0-2.2 ms a take after 50,000
-- takes held, 0.3 at the start (bench/experiments/limits_versions.py),
-- growing with every take. Now a take adds the bucket's new row, numbered
-- one past the row it read (take_seq), and deletes that row; an ask reads
-- the newest, the first in a backward walk of the key. Takes no longer
-- write the limits row: its tokens and tokens_at stay as the bucket's
-- state before the first take since this migration (a queue without a
-- bucket row reads them, so nothing is copied). Takers still lock the
-- limits row (a lock writes no version) to take one after the other.
--
-- A process's lease of a queue's permits (shardq_lease_permits, renewed
-- every 500 ms by every process) was one row, upserted, and each renewal
-- read every holder's row of the queue: held, every version of each
-- (2.2-2.7 ms a renewal after an hour of 8 processes' renewals, 0.3 at
-- the start). Now each holder of a queue has a row written once
-- (shardq_limit_holders, deleted when its lease lapses) and each renewal
-- adds the holder's lease row, numbered from a sequence (a holder that
-- comes back after its lease lapsed numbers past its old rows), and
-- deletes the one it replaces (shardq_limit_lease_moves); readers take
-- each holder's newest. The leases are copied while no grant can run
-- (each locks its limits row first: the table is locked against that);
-- the old table, emptied, goes in 0049.
--
-- The functions of this release commit with this migration (its first
-- line). A call of the old lease or take function that waits for its
-- limits row's lock below resumes after the commit with its old text, and
-- would write where the leases and buckets were, read by no one: its
-- permits would be counted by no one, its take lost. Triggers made with
-- the functions (shardq_refuse_old_limits_write.sql) refuse those writes
-- (the call fails, SQLSTATE 40001, and the next runs the new text). Every
-- wait here ends within 2 s (a transaction holding a limits row or
-- writing a limit), and the migration then fails, nothing changed, to be
-- run again (from a shard at 46 or older, whose leases and takes fail
-- from 0047 on until this commits, they fail until it is run again).
--
-- The roles that could update the limits row (the worker's takes wrote
-- the bucket there) may add and delete the bucket's rows; those that
-- could write the leases may write the new tables and take lease numbers,
-- and those that could read them may read the new ones.
SET LOCAL lock_timeout = '2s';

CREATE TABLE shardq_rate_buckets (
    queue text NOT NULL,
    take_seq bigint NOT NULL,
    tokens double precision NOT NULL,
    tokens_at timestamptz NOT NULL,
    PRIMARY KEY (queue, take_seq)
);
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
CREATE SEQUENCE shardq_limit_lease_seq;

-- Every grant and take locks its limits row first; this waits for those
-- under way and holds back the rest (a row locked, a limit written, until
-- the commit; plain reads go on). A lock of each row would not cover a
-- queue whose limit is set meanwhile.
LOCK TABLE shardq_queue_limits IN EXCLUSIVE MODE;
INSERT INTO shardq_limit_holders (queue, holder)
SELECT queue, holder FROM shardq_limit_leases;
INSERT INTO shardq_limit_lease_moves (queue, holder, renewal_seq, permits, expires_at)
SELECT queue, holder, nextval('shardq_limit_lease_seq'), permits, expires_at
FROM shardq_limit_leases;
DELETE FROM shardq_limit_leases;

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

DO $$
DECLARE
    owner text := (SELECT c.relowner::regrole::text FROM pg_class c
                   WHERE c.oid = 'shardq_limit_leases'::regclass);
    r record;
BEGIN
    EXECUTE format('ALTER TABLE shardq_limit_holders OWNER TO %s', owner);
    EXECUTE format('ALTER TABLE shardq_limit_lease_moves OWNER TO %s', owner);
    EXECUTE format('ALTER SEQUENCE shardq_limit_lease_seq OWNER TO %s', owner);
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
            EXECUTE format('GRANT USAGE ON SEQUENCE shardq_limit_lease_seq TO %s', r.role);
        END IF;
    END LOOP;
END $$;
