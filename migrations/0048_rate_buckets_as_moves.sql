-- A queue rate's token bucket as rows that are only added and deleted.
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
-- The roles that could update the limits row (the worker's takes wrote
-- the bucket there) may add and delete the bucket's rows.
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
