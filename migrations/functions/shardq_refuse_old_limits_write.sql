-- Refuses the writes that the lease and take functions made before
-- migration 0048, which moved the permit leases (shardq_limit_leases) and
-- the rate buckets (shardq_queue_limits' tokens and tokens_at) to rows
-- only added and deleted. A call of the old function that waited for a
-- limits row's lock while 0048 ran resumes after it with its old text and
-- would write where no one reads any more: permits counted by no one, a
-- take lost. This file's triggers make that call fail instead (SQLSTATE
-- 40001: the caller's next call runs the new text). They are made with
-- the functions, which 0048's transaction applies on a shard at 47 (its
-- first line), so they exist before any such call resumes (0047 applies
-- them on an older shard, a fresh one's last migration on a new one); the
-- old table's trigger goes with the table (0049).
CREATE OR REPLACE FUNCTION shardq_refuse_old_limits_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'shardq: % no longer keeps the permit leases or the '
        'rate buckets (migration 48); call again', TG_TABLE_NAME
        USING ERRCODE = '40001';
END $$;

DO $$
BEGIN
    IF to_regclass('shardq_limit_leases') IS NOT NULL THEN
        CREATE OR REPLACE TRIGGER shardq_refuse_old_lease
            BEFORE INSERT OR UPDATE ON shardq_limit_leases
            FOR EACH ROW EXECUTE FUNCTION shardq_refuse_old_limits_write();
    END IF;
    CREATE OR REPLACE TRIGGER shardq_refuse_old_bucket
        BEFORE UPDATE OF tokens, tokens_at ON shardq_queue_limits
        FOR EACH ROW EXECUTE FUNCTION shardq_refuse_old_limits_write();
END $$;
