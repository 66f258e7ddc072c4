//! Pausing and resuming queues (`shardq_paused_queues`). The claim function reads
//! `shardq_paused_queues` itself; these statements only change and list it.

/// Pauses queue $1 on this shard (no change when it is paused already):
/// one row inserted when it was running.
pub const QUEUE_PAUSE: &str = "INSERT INTO shardq_paused_queues (queue) VALUES ($1) \
    ON CONFLICT (queue) DO NOTHING";

/// Resumes queue $1 on this shard and, when it was paused, notifies
/// `shardq_ready` so idle workers claim from it at once rather than at their
/// next poll. Returns a row when it was paused.
pub const QUEUE_RESUME: &str = "WITH resumed AS ( \
        DELETE FROM shardq_paused_queues WHERE queue = $1 RETURNING queue \
    ) SELECT pg_notify('shardq_ready', queue) FROM resumed";

/// The paused queues of this shard, with when each was paused.
pub const QUEUE_PAUSED: &str = "SELECT queue, paused_at::text AS paused_at \
    FROM shardq_paused_queues ORDER BY queue";
