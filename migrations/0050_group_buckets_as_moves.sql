-- shardq:functions-with-this
-- A group rate's token buckets as rows that are only added and deleted.
--
-- Each grouped claim of a queue with a group rate upserted the bucket row
-- of every group it took from (shardq_group_tokens), and the next claim of
-- the group read it. While a long transaction holds the horizon none of
-- its versions can be removed, and a read of the row walks all of them:
-- 0.76 ms a read and 0.77 a write after 50,000 writes of one group's
-- bucket, 0.14 and 0.32 at the start of the hold, and 0.78 ms a read after
-- 20,000 claims of one group (bench/experiments/limits_versions.py
-- --group), growing with every claim. Now a claim adds the group's new
-- row, numbered from a sequence (past every earlier row of the group, also
-- one upkeep deleted as full), and deletes the row it read; the next reads
-- the newest, the first in a backward walk of the key
-- (shardq_group_buckets_of).
--
-- The functions of this release commit with this migration (its first
-- line). The old table is locked, so no claim reads or writes it meanwhile
-- (those under way end first, within 2 s, else the migration fails,
-- nothing changed, to be run again), its rows copied and the table
-- dropped: a claim of the old text that waited for the lock fails when it
-- resumes (the table is gone) and its worker claims again with the new
-- text, so no take is written where no one reads it. From a shard at 47
-- or older, whose claims run the new text from 0047 or 0048 on, claims of
-- a queue with a group rate fail until this commits, a moment later.
--
-- The roles keep the rights they had on the old buckets (upkeep locks the
-- rows it deletes: UPDATE), and those that could write them may take the
-- new rows' numbers; the owner is kept.
SET LOCAL lock_timeout = '2s';

CREATE TABLE shardq_group_buckets (
    queue text NOT NULL,
    job_group text NOT NULL,
    take_seq bigint NOT NULL,
    tokens double precision NOT NULL,
    tokens_at timestamptz NOT NULL,
    PRIMARY KEY (queue, job_group, take_seq)
);
CREATE SEQUENCE shardq_group_bucket_seq;

LOCK TABLE shardq_group_tokens IN ACCESS EXCLUSIVE MODE;
INSERT INTO shardq_group_buckets (queue, job_group, take_seq, tokens, tokens_at)
SELECT queue, job_group, nextval('shardq_group_bucket_seq'), tokens, tokens_at
FROM shardq_group_tokens;

DO $$
DECLARE
    owner text := (SELECT c.relowner::regrole::text FROM pg_class c
                   WHERE c.oid = 'shardq_group_tokens'::regclass);
    r record;
BEGIN
    EXECUTE format('ALTER TABLE shardq_group_buckets OWNER TO %s', owner);
    EXECUTE format('ALTER SEQUENCE shardq_group_bucket_seq OWNER TO %s', owner);
    FOR r IN SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                  ELSE a.grantee::regrole::text END AS role,
                    a.privilege_type
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = 'shardq_group_tokens'::regclass
               AND a.grantee <> c.relowner
               AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE') LOOP
        EXECUTE format('GRANT %s ON TABLE shardq_group_buckets TO %s',
                       r.privilege_type, r.role);
        IF r.privilege_type = 'INSERT' THEN
            EXECUTE format('GRANT USAGE ON SEQUENCE shardq_group_bucket_seq TO %s', r.role);
        END IF;
    END LOOP;
END $$;

DROP TABLE shardq_group_tokens;
