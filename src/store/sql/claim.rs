//! Taking jobs: claims, completions, releases and lease extensions.
//!
//! The claim itself is the server-side function `shardq_claim` (migration
//! 0004), since per-key exclusion needs statements that each see what the
//! ones before them did under the key locks; its comment explains how.

/// Claims up to $4 ready jobs of queue $3 for owner $5 with a lease of $6 ms,
/// after taking one of dequeue slots ($1, 0..$2), or ungated when $2 = 0.
/// Always returns at least one row: `got_slot` = 0 means "busy"; `got_slot`
/// = 1 with a NULL id means "empty". Rows come back in id order, the order a
/// key's jobs must run in. The slot is released at commit, so it works
/// through transaction-pooling proxies.
pub const JOB_CLAIM: &str = "SELECT * FROM shardq_claim($1::int, $2::int, $3::text, \
    $4::int, $5::text, $6::bigint)";

/// Asks a shard whether it answers at all: the probe of a shard that did
/// not answer a claim in time (it touches no table, so it measures the
/// server and the network, not a queue).
pub const SHARD_PROBE: &str = "SELECT 1";

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

// Why completions are written as they are: statistics taken while nothing
// was running (after a bulk enqueue, say) estimate `owner = $n` at one row.
// With the fence as a filter on `workflow_status`, the planner then walked
// the whole primary key (or every running row) once per job in the batch:
// 10 s for 2,000 completions, found by `shardq bench scale` (tests/plans.rs
// pins the plan). So the batch is a MATERIALIZED CTE that carries the owner
// as a column, and every fence condition is a join condition: nothing
// restricts the table scan, the only cheap plan left is a primary-key probe
// per batch row, and the fence is still checked on the row being updated.
// (`owner` is set only while a row is `running`, so the fence needs no
// status test, which would bring the running-rows index into play.)

/// Writes many outcomes in one statement, fenced: a row changes only while it
/// is still running under this owner ($6) and this claim's fence ($3). Each
/// row's asked status ($4) is `succeeded`, `failed` or `released`.
///
/// A failure with attempts left becomes `scheduled` again after an
/// exponential, jittered backoff ($8 ms doubling per attempt, at most $9 ms;
/// the doubling stops at 2^62, so no attempt count overflows it): the delay
/// is stored, not slept. A failure on the last attempt is `dead`.
/// A released job (claimed, never started) goes back uncounted: `queued`, or
/// `waiting` when it has a key (its key's lowest waiting job is queued when
/// the key is free). A job whose cancellation was asked and that did not
/// succeed is `cancelled`, released or not. Returns one row: written as
/// succeeded, retrying, dead, cancelled, released (each counting the rows
/// written now and those written already), and how many were written
/// already (by an earlier try of this same write whose reply was lost: the
/// row still has this claim's fence and no owner, which no other claim
/// leaves; the `again` snapshot is the statement's, from before `done`); the
/// rest were fenced out. A row counts as written already only when it agrees
/// with this write's ask: a success by a succeeded row, a failure or release
/// by a row that did not succeed. So a release of the same claim written
/// after its success (or a success after its release) is fenced, never
/// counted as a second success or a success that is not there. The `again` probes run only when `done` wrote fewer
/// rows than the batch has (a one-time filter): the common batch, written
/// whole, probes each row once, not twice.
///
/// The statement lives in `shardq_complete_many` (migration 14; 15 caps the
/// backoff's exponent), which keeps
/// one generic plan per connection: planning it took 5x longer than running
/// it for one job. tests/plans.rs checks that plan.
pub const JOB_COMPLETE_MANY: &str = "SELECT * FROM shardq_complete_many($1::int[], $2::bigint[], \
    $3::bigint[], $4::text[], $5::jsonb[], $6::text, $7::text[], $8::float8, $9::float8)";

/// Extends by $5 ms the leases of the jobs ($1 shard keys, $2 ids, $3 fences)
/// that this owner ($4) holds: one primary-key probe per job the process
/// holds, never a walk of the shard's running rows, and never a row the
/// process has forgotten (a claim whose reply was lost comes back by lease
/// expiry). Rows locked right now (their completion is being written) are
/// skipped, so the extension never waits for, or deadlocks with, a
/// completion. The owner and fence are join conditions for the reason given
/// above for completions.
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
    SET lease_expires_at = now() + $5::bigint * interval '1 millisecond' \
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
pub const JOB_OWNED_RUNNING: &str =
    "SELECT shard_key, id, fence, ordering_key IS NOT NULL AS keyed \
    FROM workflow_status \
    WHERE status = 'running' AND owner = $1 \
        AND started_at < now() - $2::bigint * interval '1 millisecond'";
