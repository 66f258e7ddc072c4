-- Time spent in claim statements (busy and empty answers included), per
-- worker and shard, cumulative in microseconds like the other counters of
-- shardq_workers: with `claims + busy + empty + errors` it gives the mean
-- time of one claim on the shard, which the dashboard's shards page shows
-- and charts. A constant default: no table rewrite.
ALTER TABLE shardq_workers ADD COLUMN IF NOT EXISTS claim_us bigint NOT NULL DEFAULT 0;
