//! Statements of `store::limits`.

/// Writes a queue's limits ($1 to $7) under a revision ($8, as the
/// conflict arm `$revision` says), `$tail` after the update.
macro_rules! limit_upsert {
    ($revision:literal, $tail:literal) => {
        concat!(
            "INSERT INTO shardq_queue_limits AS l \
            (queue, concurrency, rate_count, rate_period_ms, group_concurrency, \
             group_rate_count, group_rate_period_ms, revision) \
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
            ON CONFLICT (queue) DO UPDATE SET concurrency = EXCLUDED.concurrency, \
                rate_count = EXCLUDED.rate_count, rate_period_ms = EXCLUDED.rate_period_ms, \
                group_concurrency = EXCLUDED.group_concurrency, \
                group_rate_count = EXCLUDED.group_rate_count, \
                group_rate_period_ms = EXCLUDED.group_rate_period_ms, updated_at = now(), \
                revision = ",
            $revision,
            " ",
            $tail
        )
    };
}

/// On the home shard (the first): writes a queue's limits under the next
/// revision, at least $8 (one above every revision the writer read on any
/// shard) and above the row's own, and returns it. The row's lock orders
/// concurrent writers: each gets a higher revision than the one before it,
/// whatever their clocks say.
pub const LIMIT_SET_HOME: &str = limit_upsert!(
    "greatest(l.revision + 1, EXCLUDED.revision)",
    "RETURNING revision"
);

/// On the home shard: moves a queue's revision from $2, the one a change
/// was written under, to $3, unless a later change replaced it there.
pub const LIMIT_RAISE_HOME: &str =
    "UPDATE shardq_queue_limits SET revision = $3, updated_at = now() \
    WHERE queue = $1 AND revision = $2 RETURNING revision";

/// On the other shards: writes a queue's limits if `revision` (the home
/// shard's) is newer than the row's.
pub const LIMIT_SET: &str =
    limit_upsert!("EXCLUDED.revision", "WHERE l.revision < EXCLUDED.revision");

/// One queue's revision.
pub const LIMIT_REVISION: &str = "SELECT revision FROM shardq_queue_limits WHERE queue = $1";

/// Every queue's limits (a cleared queue's row has no limit left).
pub const LIMITS_READ: &str = "SELECT queue, concurrency, rate_count, rate_period_ms, \
    group_concurrency, group_rate_count, group_rate_period_ms, revision \
    FROM shardq_queue_limits ORDER BY queue";

/// Per queue, the unexpired permits and how many processes hold them
/// (migrations/functions/shardq_permits_in_use.sql).
pub const LIMIT_PERMITS_IN_USE: &str =
    "SELECT queue, permits, holders FROM shardq_permits_in_use()";

/// Leases permits (migrations/functions/shardq_lease_permits.sql).
pub const LIMIT_LEASE_PERMITS: &str = "SELECT queue, concurrency, granted, rate_count, \
    rate_period_ms FROM shardq_lease_permits($1, $2, $3, $4)";

/// Takes starts from a rate's bucket, or gives unused ones back
/// (migrations/functions/shardq_take_starts.sql).
pub const LIMIT_TAKE_STARTS: &str = "SELECT shardq_take_starts($1, $2) AS starts";
