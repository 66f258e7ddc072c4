//! Taking jobs: claims, completions, releases and lease extensions.

/// Gated claim in one round trip. Tries dequeue slots 0..$2 with
/// `pg_try_advisory_xact_lock($1, slot)` and stops at the first it gets; only
/// then claims up to $4 ready jobs of queue $3 for owner $5 with a lease of
/// $6 ms. Always returns at least one row: `got_slot` = 0 means "busy";
/// `got_slot` = 1 with a NULL id means "empty". The slot is released at commit,
/// so it works through transaction-pooling proxies.
pub fn job_claim_gated() -> String {
    claim_statement(
        "slot AS MATERIALIZED ( \
            SELECT s FROM generate_series(0, $2::int - 1) AS s \
            WHERE pg_try_advisory_xact_lock($1::int, s) LIMIT 1 \
        ),",
        "EXISTS (SELECT 1 FROM slot)",
        "(SELECT count(*) FROM slot)::int",
    )
}

/// Plain SKIP LOCKED claim (no slots), same parameters and result shape as
/// [`job_claim_gated`]; $1 and $2 are only type-checked.
pub fn job_claim_ungated() -> String {
    claim_statement("", "$1::int IS NOT NULL AND $2::int IS NOT NULL", "1")
}

/// The claim body shared by both modes.
///
/// Per-key ordering: the statement locks up to $4 candidates, then claims a
/// keyed candidate only when every earlier unfinished job of its key is also
/// among its own candidates. So a batch may hold several consecutive jobs of a
/// key (run in order by one executor slot), while no other claim can take a
/// later job of that key until the earlier ones are finished: an earlier job
/// locked by someone else is not among our candidates, and one already
/// claimed is `running`. All of a key's jobs share a shard, so this is a
/// one-shard check; it spans queues. Unclaimed candidates stay queued.
/// Rows come back in id (enqueue) order, the order a key's jobs must run in.
fn claim_statement(gate_cte: &str, gate_open: &str, got_slot: &str) -> String {
    format!(
        "WITH {gate_cte} candidates AS ( \
            SELECT shard_key, id, ordering_key FROM workflow_status \
            WHERE queue = $3 AND status = 'queued' AND {gate_open} \
            ORDER BY priority, id LIMIT $4 FOR UPDATE SKIP LOCKED \
        ), picked AS ( \
            SELECT c.shard_key, c.id FROM candidates c \
            WHERE c.ordering_key IS NULL OR NOT EXISTS ( \
                SELECT 1 FROM workflow_status e \
                WHERE e.ordering_key = c.ordering_key AND e.id < c.id \
                  AND e.status IN ('scheduled', 'queued', 'running') \
                  AND NOT EXISTS (SELECT 1 FROM candidates o \
                                  WHERE o.shard_key = e.shard_key AND o.id = e.id)) \
        ), claimed AS ( \
            UPDATE workflow_status w SET status = 'running', owner = $5, \
                attempts = w.attempts + 1, started_at = now(), \
                lease_expires_at = now() + $6::bigint * interval '1 millisecond' \
            FROM picked WHERE w.shard_key = picked.shard_key AND w.id = picked.id \
            RETURNING w.shard_key, w.id, w.handler, w.ordering_key, \
                w.priority, w.payload, w.attempts, w.queue, w.created_at \
        ) \
        SELECT {got_slot} AS got_slot, c.* FROM (SELECT 1) AS one LEFT JOIN claimed c ON true \
        ORDER BY c.id"
    )
}

// Why completions and releases are written as they are: statistics taken
// while nothing was running (after a bulk enqueue, say) estimate `owner = $n`
// at one row. With the fence as a filter on `workflow_status`, the planner
// then walked the whole primary key (or every running row) once per job in
// the batch: 10 s for 2,000 completions, found by `shardq bench scale`
// (tests/plans.rs pins the plan). So the batch is a MATERIALIZED CTE that
// carries the owner as a column, and every fence condition is a join
// condition: nothing restricts the table scan, the only cheap plan left is a
// primary-key probe per batch row, and the fence is still checked on the row
// being updated. (`owner` is set only while a row is `running`, so the fence
// needs no status test, which would bring the running-rows index into play.)

/// Writes many outcomes in one statement, fenced: a row changes only while it
/// is still running under this owner ($6) and this attempt. A failure with
/// attempts left becomes `scheduled` again after an exponential, jittered
/// backoff ($8 ms doubling per attempt, at most $9 ms): the delay is stored,
/// not slept. A failure on the last attempt is `dead`; a job whose
/// cancellation was asked and that did not succeed is `cancelled`. Returns one
/// row: written as succeeded, retrying, dead, cancelled; the rest were fenced out.
pub const JOB_COMPLETE_MANY: &str = "WITH batch AS MATERIALIZED ( \
        SELECT c.*, $6::text AS owner \
        FROM unnest($1::int[], $2::bigint[], $3::int[], $4::text[], $5::jsonb[], $7::text[]) \
            AS c(shard_key, id, attempt, status, output, error) \
    ), done AS ( \
        UPDATE workflow_status w SET \
            status = CASE \
                WHEN c.status = 'succeeded' THEN 'succeeded' \
                WHEN w.cancel_requested THEN 'cancelled' \
                WHEN w.attempts >= w.max_attempts THEN 'dead' \
                ELSE 'scheduled' END, \
            run_at = CASE WHEN c.status = 'succeeded' OR w.cancel_requested \
                    OR w.attempts >= w.max_attempts THEN w.run_at \
                ELSE now() + least($9::float8, $8::float8 * power(2, w.attempts - 1)) \
                    * (0.5 + random() * 0.5) * interval '1 millisecond' END, \
            finished_at = CASE WHEN c.status = 'succeeded' OR w.cancel_requested \
                    OR w.attempts >= w.max_attempts THEN now() END, \
            output = c.output, error = c.error, owner = NULL, lease_expires_at = NULL \
        FROM batch c \
        WHERE w.shard_key = c.shard_key AND w.id = c.id \
            AND w.owner = c.owner AND w.attempts = c.attempt \
        RETURNING w.status \
    ) \
    SELECT count(*) FILTER (WHERE status = 'succeeded'), \
        count(*) FILTER (WHERE status = 'scheduled'), \
        count(*) FILTER (WHERE status = 'dead'), \
        count(*) FILTER (WHERE status = 'cancelled') \
    FROM done";

/// Gives claimed-but-unstarted jobs back to the queue at once (shutdown), fenced
/// like completions; the attempt is not counted.
pub const JOB_RELEASE_MANY: &str = "WITH batch AS MATERIALIZED ( \
        SELECT c.*, $4::text AS owner \
        FROM unnest($1::int[], $2::bigint[], $3::int[]) AS c(shard_key, id, attempt) \
    ) \
    UPDATE workflow_status w SET status = 'queued', \
        owner = NULL, lease_expires_at = NULL, started_at = NULL, attempts = w.attempts - 1 \
    FROM batch c \
    WHERE w.shard_key = c.shard_key AND w.id = c.id \
        AND w.owner = c.owner AND w.attempts = c.attempt";

/// Extends the lease of every job this owner ($1) holds on the shard by $2 ms.
/// Rows locked right now (their completion is being written) are skipped, so
/// the extension never waits for, or deadlocks with, a completion.
pub const JOB_EXTEND_LEASES: &str = "UPDATE workflow_status w \
    SET lease_expires_at = now() + $2::bigint * interval '1 millisecond' \
    FROM (SELECT shard_key, id FROM workflow_status \
          WHERE status = 'running' AND owner = $1 \
          FOR UPDATE SKIP LOCKED) AS held \
    WHERE w.shard_key = held.shard_key AND w.id = held.id";

/// Running jobs of this owner ($1) whose cancellation was asked.
pub const JOB_CANCEL_REQUESTED: &str = "SELECT shard_key, id FROM workflow_status \
    WHERE status = 'running' AND owner = $1 AND cancel_requested";
