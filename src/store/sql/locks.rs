//! Key locks around a transaction that changes keyed jobs
//! (`exec::under_key_locks`, upkeep): taken first, released last, with the
//! freed keys' next jobs queued.

/// Waits for the key locks of the keyed jobs among ($1 shard keys, $2 ids).
/// Run first in a transaction that changes keyed jobs.
pub const KEYS_LOCK: &str = "SELECT shardq_lock_keys($1::int[], $2::bigint[])";

/// Queues the lowest waiting job of every key among ($1, $2) that nothing
/// holds any more, and when it queued any, notifies `shardq_ready` with their
/// queues (a freed key's next job wakes idle workers like an enqueue). Run
/// last, in the transaction that took [`KEYS_LOCK`].
pub const KEYS_PROMOTE: &str = "WITH promoted AS MATERIALIZED ( \
        SELECT shardq_promote_keys($1::int[], $2::bigint[]) AS n \
    ) \
    SELECT pg_notify('shardq_ready', q.queue) FROM promoted, LATERAL ( \
        SELECT DISTINCT w.queue FROM unnest($1::int[], $2::bigint[]) AS j(shard_key, id) \
        JOIN workflow_status w ON w.shard_key = j.shard_key AND w.id = j.id \
        WHERE w.ordering_key IS NOT NULL \
    ) q WHERE promoted.n > 0";
