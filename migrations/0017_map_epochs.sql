-- The versioned shard map: explicit shard_key ranges per epoch (issue 23).
--
-- An epoch is one whole map: its ranges [first_key, end_key) tile the key
-- space 0..65536 with no gap or overlap, each giving its keys to one shard
-- (an index into the configured list). The highest epoch recorded on a
-- shard is its current map; older epochs stay, so a caller routed by one
-- is told it is stale (SQLSTATE SQ004) rather than guessed at. Explicit
-- ranges let a later move split one range and touch only the keys that
-- move.
--
-- Tables (and the drop of three signatures, below). `shardq migrate` fills epoch 1 in this migration's
-- transaction (src/migrate/run.rs, record_place): the ranges of today's
-- formula, shard i holding the keys k with k * shard_count / 65536 = i,
-- read from shardq_shard_map, and checks that the ranges tile. A CHECK
-- cannot see other rows, so the tiling is checked by whoever writes an
-- epoch (and by `shardq check`), not by a constraint.
CREATE TABLE shardq_map_epochs (
    epoch       integer     PRIMARY KEY CHECK (epoch >= 1),
    shard_count integer     NOT NULL CHECK (shard_count >= 1),
    recorded_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE shardq_map_ranges (
    epoch       integer NOT NULL REFERENCES shardq_map_epochs (epoch),
    first_key   integer NOT NULL,
    end_key     integer NOT NULL,
    shard_index integer NOT NULL CHECK (shard_index >= 0),
    PRIMARY KEY (epoch, first_key),
    CHECK (0 <= first_key AND first_key < end_key AND end_key <= 65536)
);

-- Read by every worker and client at start, under any role, as
-- shardq_shard_map; writing stays with the owner that migrates.
GRANT SELECT ON TABLE shardq_map_epochs TO PUBLIC;
GRANT SELECT ON TABLE shardq_map_ranges TO PUBLIC;

-- shardq_enqueue, shardq_enqueue_many and shardq_enqueue_row gain a
-- trailing p_epoch (migrations/functions/): their old signatures go here, in
-- the transaction that applies the new texts, so callers never find neither.
DROP FUNCTION IF EXISTS shardq_enqueue(text, text, jsonb, text, text, timestamptz, int, int);
DROP FUNCTION IF EXISTS shardq_enqueue_many(jsonb);
DROP FUNCTION IF EXISTS shardq_enqueue_row(text, text, text, jsonb, text, text, timestamptz, int, int);
