-- Writes what a grouped claim took from its groups' start-rate buckets in
-- `p_queue` (migration 0050): for each group, the bucket's new row
-- (`p_tokens` at `p_at`, numbered from shardq_group_bucket_seq: past every
-- earlier row of the group, one upkeep deleted too) and the deletion of
-- the row the claim read (`p_read_seqs`, NULL when it read none), found by
-- its key: a row upkeep deleted as full meanwhile is simply not found.
-- Called under each group's lock, so no other claim writes these buckets
-- between the read and this. plpgsql, so that it applies to a schema older
-- than its table; no bitmap or sequential scan: a plan made while the
-- table was small (one per connection) would otherwise read every row a
-- held horizon keeps.
CREATE OR REPLACE FUNCTION shardq_group_buckets_write(p_queue text, p_groups text[],
                                                      p_read_seqs bigint[],
                                                      p_tokens double precision[],
                                                      p_at timestamptz)
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
BEGIN
    INSERT INTO shardq_group_buckets (queue, job_group, take_seq, tokens, tokens_at)
    SELECT p_queue, w.g, nextval('shardq_group_bucket_seq'), w.tokens, p_at
    FROM unnest(p_groups, p_tokens) AS w(g, tokens);
    DELETE FROM shardq_group_buckets b WHERE b.ctid = ANY (ARRAY(
        SELECT (SELECT x.ctid FROM shardq_group_buckets x
                WHERE x.queue = p_queue AND x.job_group = r.g AND x.take_seq = r.seq)
        FROM unnest(p_groups, p_read_seqs) AS r(g, seq)
        WHERE r.seq IS NOT NULL));
END
$$;
