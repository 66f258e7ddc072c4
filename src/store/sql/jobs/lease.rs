//! What a process does for the jobs it holds: lease extensions, cancellation
//! asks, and finding the jobs a lost claim reply left it owning.

/// Extends by $5 ms the leases of the jobs ($1 shard keys, $2 ids, $3 fences)
/// that this owner ($4) holds: one primary-key probe per job the process
/// holds, never a walk of the shard's running rows, and never a row the
/// process has forgotten (a claim whose reply was lost comes back by lease
/// expiry). Rows locked right now (their completion is being written) are
/// skipped, so the extension never waits for, or deadlocks with, a
/// completion. The owner and fence are join conditions for the reason given
/// in `complete.rs` for completions. The new lease runs from the clock at
/// the write, after the row locks took this transaction's id (the lease
/// floor relies on it: migration 51).
pub const JOB_EXTEND_LEASES: &str = "WITH held AS MATERIALIZED ( \
        SELECT h.*, $4::text AS owner \
        FROM unnest($1::int[], $2::bigint[], $3::bigint[]) AS h(shard_key, id, fence) \
    ), locked AS ( \
        SELECT t.shard_key, t.id FROM workflow_status t \
        JOIN held h ON t.shard_key = h.shard_key AND t.id = h.id \
            AND t.owner = h.owner AND t.fence = h.fence \
        FOR UPDATE OF t SKIP LOCKED \
    ) \
    UPDATE workflow_status w \
    SET lease_expires_at = clock_timestamp() + $5::bigint * interval '1 millisecond' \
    FROM locked WHERE w.shard_key = locked.shard_key AND w.id = locked.id";

/// Which of the jobs ($1 shard keys, $2 ids) had their cancellation asked:
/// one primary-key probe per job this process holds.
pub const JOB_CANCEL_REQUESTED: &str = "SELECT w.shard_key, w.id \
    FROM unnest($1::int[], $2::bigint[]) AS h(shard_key, id) \
    JOIN workflow_status w ON w.shard_key = h.shard_key AND w.id = h.id \
    WHERE w.cancel_requested";

/// Running jobs of owner $1 claimed more than $2 ms ago (so no claim reply
/// for them can still arrive), with their fences and whether they have a
/// key. A process compares them with the jobs it holds to find the ones a
/// lost claim reply left it owning. Walks the shard's running rows: run only
/// after a claim's reply may have been lost.
pub const JOB_OWNED_RUNNING: &str = "SELECT shard_key, id, fence, queue, ordering_key \
    FROM workflow_status \
    WHERE status = 'running' AND owner = $1 \
        AND started_at < now() - $2::bigint * interval '1 millisecond'";
