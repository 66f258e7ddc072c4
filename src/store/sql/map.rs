//! The versioned shard map (`shardq_map_epochs`, `shardq_map_ranges`,
//! migration 17).

/// Records epoch 1 from this shard's place (`shardq_shard_map`) when no
/// epoch is recorded: the ranges of the formula `shard_key * n / 65536`,
/// shard i holding `ceil(i * 65536 / n) .. ceil((i + 1) * 65536 / n)`
/// (src/shard_map.rs, `ShardMap::from_formula`). Returns the ranges
/// written (none when an epoch or no place is recorded). Run under the
/// migration lock.
pub const MAP_EPOCH_ONE_RECORD: &str = "WITH place AS ( \
        SELECT shard_count AS n FROM shardq_shard_map \
        WHERE NOT EXISTS (SELECT 1 FROM shardq_map_epochs)), \
    epoch AS ( \
        INSERT INTO shardq_map_epochs (epoch, shard_count) SELECT 1, n FROM place \
        RETURNING shard_count AS n) \
    INSERT INTO shardq_map_ranges (epoch, first_key, end_key, shard_index) \
    SELECT 1, ((i::bigint * 65536 + n - 1) / n)::int, \
        (((i::bigint + 1) * 65536 + n - 1) / n)::int, i \
    FROM epoch, generate_series(0, n - 1) AS i";

/// The epochs whose ranges do not tile the key space 0..65536 (a gap, an
/// overlap, or none at all) or name a shard outside the epoch's count.
pub const MAP_EPOCHS_UNTILED: &str = "SELECT e.epoch FROM shardq_map_epochs e \
    LEFT JOIN LATERAL ( \
        SELECT bool_and(t.joins AND t.shard_index < e.shard_count) AS ok, \
            max(t.end_key) AS last \
        FROM (SELECT r.end_key, r.shard_index, \
                  r.first_key = lag(r.end_key, 1, 0) OVER (ORDER BY r.first_key) AS joins \
              FROM shardq_map_ranges r WHERE r.epoch = e.epoch) t) c ON true \
    WHERE c.ok IS NOT TRUE OR c.last IS DISTINCT FROM 65536 ORDER BY e.epoch";

/// Whether the map tables exist (schema version 17 or later).
pub const MAP_TABLES_EXIST: &str = "SELECT to_regclass('shardq_map_ranges') IS NOT NULL AS present";

/// The current (highest) epoch and its shard count; no row when none.
pub const MAP_EPOCH_CURRENT: &str = "SELECT epoch, shard_count FROM shardq_map_epochs \
    ORDER BY epoch DESC LIMIT 1";

/// The ranges of epoch $1, by first key.
pub const MAP_RANGES_OF: &str = "SELECT first_key, end_key, shard_index FROM shardq_map_ranges \
    WHERE epoch = $1 ORDER BY first_key";

/// Unfinished jobs (waiting, scheduled, queued, running, held) per shard key, for
/// `shardq shards show`: one scan of the table, an operator's command.
pub const MAP_UNFINISHED_BY_KEY: &str = "SELECT shard_key, count(*) AS n FROM workflow_status \
    WHERE status IN ('waiting', 'scheduled', 'queued', 'running', 'held') GROUP BY shard_key";
