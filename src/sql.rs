//! Every SQL statement shardq runs, in one place, named after what it does.
//! Values are always bind parameters.

/// Serialises migration runs on one shard (`pg_advisory_xact_lock` key).
pub const MIGRATION_LOCK_KEY: i64 = 0x7368_6172_6471_0001;

/// Creates the table that records applied migrations.
pub const MIGRATIONS_TABLE_CREATE: &str = "CREATE TABLE IF NOT EXISTS shardq_migrations (\
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())";

/// Waits for the migration lock for this transaction.
pub const MIGRATION_LOCK: &str = "SELECT pg_advisory_xact_lock($1)";

/// Applied migration versions.
pub const MIGRATIONS_APPLIED: &str = "SELECT version FROM shardq_migrations ORDER BY version";

/// Records one applied migration.
pub const MIGRATION_RECORD: &str = "INSERT INTO shardq_migrations (version, name) VALUES ($1, $2)";

/// Whether the migrations table exists.
pub const MIGRATIONS_TABLE_EXISTS: &str = "SELECT to_regclass('shardq_migrations') IS NOT NULL";

/// Newest applied migration, or NULL when none.
pub const MIGRATION_CURRENT: &str = "SELECT max(version) FROM shardq_migrations";

/// Inserts many jobs in one statement; returns their ids in input order.
pub const JOB_INSERT_MANY: &str = "INSERT INTO workflow_status \
    (shard_key, queue, handler, ordering_key, priority, payload) \
    SELECT shard_key, queue, handler, ordering_key, priority, payload \
    FROM unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::int[], $6::jsonb[]) \
        WITH ORDINALITY AS t(shard_key, queue, handler, ordering_key, priority, payload, ord) \
    ORDER BY ord \
    RETURNING id";

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
                  AND e.status IN ('queued', 'running') \
                  AND NOT EXISTS (SELECT 1 FROM candidates o \
                                  WHERE o.shard_key = e.shard_key AND o.id = e.id)) \
        ), claimed AS ( \
            UPDATE workflow_status w SET status = 'running', owner = $5, \
                attempts = w.attempts + 1, started_at = now(), \
                lease_expires_at = now() + $6::bigint * interval '1 millisecond' \
            FROM picked WHERE w.shard_key = picked.shard_key AND w.id = picked.id \
            RETURNING w.shard_key, w.id, w.handler, w.ordering_key, \
                w.priority, w.payload, w.attempts, w.queue \
        ) \
        SELECT {got_slot} AS got_slot, c.* FROM (SELECT 1) AS one LEFT JOIN claimed c ON true \
        ORDER BY c.id"
    )
}

/// Writes many outcomes in one statement, fenced: a row changes only while it
/// is still running under this owner ($6) and this attempt. Returns one row:
/// rows written, and how many of those were failures; the rest were fenced out.
pub const JOB_COMPLETE_MANY: &str = "WITH done AS ( \
        UPDATE workflow_status w SET status = c.status, \
            output = c.output, error = c.error, finished_at = now(), owner = NULL, lease_expires_at = NULL \
        FROM unnest($1::int[], $2::bigint[], $3::int[], $4::text[], $5::jsonb[], $7::text[]) \
            AS c(shard_key, id, attempt, status, output, error) \
        WHERE w.shard_key = c.shard_key AND w.id = c.id AND w.status = 'running' \
            AND w.owner = $6 AND w.attempts = c.attempt \
        RETURNING w.status \
    ) \
    SELECT count(*), count(*) FILTER (WHERE status = 'failed') FROM done";

/// Puts jobs whose lease expired back in the queue, at most $2 per call, when
/// this caller gets the shard's recovery lock ($1). Returns one row per job.
pub const JOB_RECOVER_EXPIRED: &str = "WITH gate AS MATERIALIZED ( \
        SELECT pg_try_advisory_xact_lock($1::int, 0) AS got \
    ), expired AS ( \
        SELECT shard_key, id FROM workflow_status \
        WHERE status = 'running' AND lease_expires_at < now() AND (SELECT got FROM gate) \
        ORDER BY lease_expires_at LIMIT $2 FOR UPDATE SKIP LOCKED \
    ) \
    UPDATE workflow_status w SET status = 'queued', owner = NULL, lease_expires_at = NULL \
    FROM expired WHERE w.shard_key = expired.shard_key AND w.id = expired.id \
    RETURNING w.id";

/// Gives claimed-but-unstarted jobs back to the queue at once (shutdown), fenced
/// like completions; the attempt is not counted.
pub const JOB_RELEASE_MANY: &str = "UPDATE workflow_status w SET status = 'queued', \
        owner = NULL, lease_expires_at = NULL, started_at = NULL, attempts = w.attempts - 1 \
    FROM unnest($1::int[], $2::bigint[], $3::int[]) AS c(shard_key, id, attempt) \
    WHERE w.shard_key = c.shard_key AND w.id = c.id AND w.status = 'running' \
        AND w.owner = $4 AND w.attempts = c.attempt";

/// Extends the lease of every job this owner ($1) holds on the shard by $2 ms.
pub const JOB_EXTEND_LEASES: &str = "UPDATE workflow_status \
    SET lease_expires_at = now() + $2::bigint * interval '1 millisecond' \
    WHERE status = 'running' AND owner = $1";

/// Whether queue $1 has any queued or running job on this shard.
pub const QUEUE_HAS_PENDING: &str = "SELECT EXISTS (SELECT 1 FROM workflow_status \
        WHERE queue = $1 AND status = 'queued') \
    OR EXISTS (SELECT 1 FROM workflow_status WHERE queue = $1 AND status = 'running')";

/// Job counts by queue and status.
pub const QUEUE_COUNTS: &str = "SELECT queue, status, count(*) FROM workflow_status \
    GROUP BY queue, status ORDER BY queue, status";

/// One job by key.
pub const JOB_GET: &str = "SELECT queue, handler, ordering_key, priority, status, payload, \
    output, error, attempts, owner, created_at::text, started_at::text, finished_at::text \
    FROM workflow_status WHERE shard_key = $1 AND id = $2";
