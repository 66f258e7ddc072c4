//! The reshard run's own statements (its checks and the emptying of the
//! shard that left), in one place.

/// Unfinished jobs holding a deduplication id, stand-ins left out.
pub const DEDUP_HELD: &str = "SELECT dedup_id, shard_key, id FROM workflow_status \
    WHERE dedup_id IS NOT NULL AND status IN ('scheduled', 'queued', 'running', 'held') \
      AND NOT (status = 'held' AND held_status = 'running')";

/// The run's jobs on a shard, stand-ins left out: payload `u`, status
/// (`unfinished` for any state but the final ones), deduplication id, id.
pub const JOBS: &str = "SELECT (payload->>'u')::bigint AS u, \
        CASE WHEN status IN ('succeeded', 'failed', 'dead', 'cancelled') THEN status \
             ELSE 'unfinished' END AS status, \
        dedup_id, shard_key, id \
    FROM workflow_status \
    WHERE queue = $1 AND NOT (status = 'held' AND held_status = 'running')";

/// The run's jobs that succeeded on a shard.
pub const SUCCEEDED: &str =
    "SELECT count(*) FROM workflow_status WHERE queue = $1 AND status = 'succeeded'";

/// Holds the job table of the shard that left (inside the emptying
/// transaction): nothing is written there while it is read and emptied.
pub const LOCK_JOBS: &str = "SET LOCAL lock_timeout = '10s'; LOCK workflow_status";

/// Empties the job table of the shard that left.
pub const EMPTY_JOBS: &str = "TRUNCATE workflow_status CASCADE";

/// A change of a queue's limit with a revision of its own (a skewed
/// writer's clock).
pub const SKEWED_LIMIT: &str =
    "INSERT INTO shardq_queue_limits (queue, concurrency, revision) VALUES ($1, 64, $2)";
