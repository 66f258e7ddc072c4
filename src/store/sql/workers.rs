//! Worker heartbeats (`shardq_workers`) and giving back the jobs of workers
//! that stopped beating.

/// Writes this worker's row on the shard: inserted on the first beat,
/// counters and `heartbeat_at` replaced on every later one. $1 worker id, $2
/// host, $3 pid, $4 queues, $5 ms since the worker started, $6..$12 the
/// cumulative counters (claims, claimed, busy, empty, errors, completed,
/// claim time in µs).
pub const WORKER_HEARTBEAT: &str = "INSERT INTO shardq_workers \
    (worker_id, host, pid, queues, started_at, heartbeat_at, \
     claims, claimed, busy, empty, errors, completed, claim_us) \
    VALUES ($1, $2, $3, $4, now() - $5::bigint * interval '1 millisecond', now(), \
            $6, $7, $8, $9, $10, $11, $12) \
    ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = now(), \
        claims = EXCLUDED.claims, claimed = EXCLUDED.claimed, busy = EXCLUDED.busy, \
        empty = EXCLUDED.empty, errors = EXCLUDED.errors, completed = EXCLUDED.completed, \
        claim_us = EXCLUDED.claim_us";

/// The workers silent for longer than $2 ms before worker $1's previous
/// heartbeat on this shard, locked (rows another releaser holds are
/// skipped). Judged against the caller's own last beat, not the clock: when
/// the shard itself did not answer for a while, every worker's row is old,
/// and none of them missed a beat this shard could have taken. No previous
/// beat of $1 (its first): none.
pub const WORKERS_SILENT: &str = "SELECT d.worker_id FROM shardq_workers d \
    WHERE d.heartbeat_at < (SELECT m.heartbeat_at FROM shardq_workers m WHERE m.worker_id = $1) \
        - $2::bigint * interval '1 millisecond' \
    FOR UPDATE OF d SKIP LOCKED";

/// Up to $2 running jobs of the owners $1, locked (rows being written now
/// are skipped: their completion or extension is in flight).
pub const JOBS_OF_OWNERS: &str = "SELECT shard_key, id FROM workflow_status \
    WHERE status = 'running' AND owner = ANY($1::text[]) \
    ORDER BY lease_expires_at LIMIT $2 FOR UPDATE SKIP LOCKED";

/// Gives back the jobs among ($1, $2) still running under one of the
/// silent owners $3, as lease recovery does (`return_lost!` in macros.rs) without
/// waiting for the lease: the owner's late completion (it was alive after
/// all, only cut off) is fenced out.
pub const JOB_RELEASE_SILENT: &str = return_lost!(
    "'worker ' || w.owner || ' stopped heartbeating on attempt ' || w.attempts \
        || ' of ' || w.max_attempts || ' (it crashed, hung or lost the shard)'",
    "w.owner = ANY($3::text[])"
);

/// Deletes the rows of the silent workers $1 that hold no running job on
/// this shard any more (one whose jobs could not all be given back yet
/// keeps its row, so a later beat tries again).
pub const WORKERS_FORGET: &str = "DELETE FROM shardq_workers d \
    WHERE d.worker_id = ANY($1::text[]) AND NOT EXISTS ( \
        SELECT 1 FROM workflow_status w WHERE w.status = 'running' AND w.owner = d.worker_id)";

/// Deletes worker $1's row (it stopped).
pub const WORKER_DELETE: &str = "DELETE FROM shardq_workers WHERE worker_id = $1";

/// The workers whose heartbeat is at most $1 ms old, oldest started first.
pub const WORKERS_LIVE: &str = "SELECT worker_id, host, pid, queues, \
        started_at::text AS started_at, \
        (extract(epoch FROM now() - heartbeat_at) * 1000)::bigint AS heartbeat_age_ms, \
        claims, claimed, busy, empty, errors, completed, claim_us \
    FROM shardq_workers \
    WHERE heartbeat_at >= now() - $1::bigint * interval '1 millisecond' \
    ORDER BY started_at, worker_id";
