//! Worker heartbeats (`shardq_workers`, migration 9).

/// Writes this worker's row on the shard: inserted on the first beat,
/// counters and `heartbeat_at` replaced on every later one. $1 worker id, $2
/// host, $3 pid, $4 queues, $5 ms since the worker started, $6..$11 the
/// cumulative counters (claims, claimed, busy, empty, errors, completed).
pub const WORKER_HEARTBEAT: &str = "INSERT INTO shardq_workers \
    (worker_id, host, pid, queues, started_at, heartbeat_at, \
     claims, claimed, busy, empty, errors, completed) \
    VALUES ($1, $2, $3, $4, now() - $5::bigint * interval '1 millisecond', now(), \
            $6, $7, $8, $9, $10, $11) \
    ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = now(), \
        claims = EXCLUDED.claims, claimed = EXCLUDED.claimed, busy = EXCLUDED.busy, \
        empty = EXCLUDED.empty, errors = EXCLUDED.errors, completed = EXCLUDED.completed";

/// Deletes the rows of workers whose last heartbeat is older than $1 ms
/// (they stopped without saying so: killed, or the shard was unreachable).
pub const WORKERS_EXPIRE: &str = "DELETE FROM shardq_workers \
    WHERE heartbeat_at < now() - $1::bigint * interval '1 millisecond'";

/// Deletes worker $1's row (it stopped).
pub const WORKER_DELETE: &str = "DELETE FROM shardq_workers WHERE worker_id = $1";

/// The workers whose heartbeat is at most $1 ms old, oldest started first.
pub const WORKERS_LIVE: &str = "SELECT worker_id, host, pid, queues, \
        started_at::text AS started_at, \
        (extract(epoch FROM now() - heartbeat_at) * 1000)::bigint AS heartbeat_age_ms, \
        claims, claimed, busy, empty, errors, completed \
    FROM shardq_workers \
    WHERE heartbeat_at >= now() - $1::bigint * interval '1 millisecond' \
    ORDER BY started_at, worker_id";
