//! Reading one job.

/// One job by key.
pub const JOB_GET: &str = "SELECT queue, handler, ordering_key, priority, status, payload, \
    output, error, attempts, max_attempts, owner, dedup_id, cancel_requested, \
    created_at::text AS created_at, run_at::text AS run_at, \
    started_at::text AS started_at, finished_at::text AS finished_at \
    FROM workflow_status WHERE shard_key = $1 AND id = $2";

/// The status, output and error of one job.
pub const JOB_OUTCOME: &str = "SELECT status, output, error FROM workflow_status \
    WHERE shard_key = $1 AND id = $2";

/// Whether this shard holds job (`$1` shard key, `$2` id): finds the shard of
/// a job written under an older shard map (one primary-key probe).
pub const JOB_EXISTS: &str = "SELECT 1 FROM workflow_status WHERE shard_key = $1 AND id = $2";
