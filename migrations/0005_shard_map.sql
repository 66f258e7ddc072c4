-- The shard map: this shard's place in the configured shard list.
--
-- Routing is by range: shard_key (0..65535) lives on shard
-- `shard_key * shard_count / 65536`, so adding, removing or reordering shards
-- moves keys to other shards. `shardq migrate` records here the count and
-- index it migrated this shard as (in the same transaction as the
-- migrations); `shardq migrate` and a worker's start check refuse a shard
-- list that disagrees with it.
--
-- One row (`one_row` is its primary key and can only be true). Online
-- resharding will add a map version (an epoch, `map_version bigint NOT NULL
-- DEFAULT 1`) and key the table by it instead, so old and new maps can be
-- recorded side by side while ranges move; readers of today's columns keep
-- working.
CREATE TABLE shardq_shard_map (
    one_row     boolean     PRIMARY KEY DEFAULT true CHECK (one_row),
    shard_count integer     NOT NULL CHECK (shard_count >= 1),
    shard_index integer     NOT NULL CHECK (shard_index >= 0 AND shard_index < shard_count),
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- Every worker and client reads the map at start, under any role (the
-- least-privilege role included); it holds nothing secret. Writing it stays
-- with the owner that migrates.
GRANT SELECT ON TABLE shardq_shard_map TO PUBLIC;
