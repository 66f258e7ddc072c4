//! Durable workflow steps.

/// The recorded output of one step (for tools and tests: a run reads its
/// whole log once, [`STEP_LOG`]).
#[cfg(feature = "internal")]
pub const STEP_GET: &str = "SELECT output FROM workflow_steps \
    WHERE shard_key = $1 AND workflow_id = $2 AND step_name = $3";

/// Every recorded step of a workflow ($1 shard key, $2 id), with whether
/// the claim ($3 owner, $4 fence) holds it and for how many more µs its
/// lease runs by the shard's clock: `shardq_step_log`
/// (migrations/functions/shardq_step_log.sql). One row per step; one row
/// with NULL step columns when none is recorded; no row when the workflow
/// is gone. Read by a run at its first step ([`crate::store::steps::log`]).
pub const STEP_LOG: &str =
    "SELECT * FROM shardq_step_log($1::int, $2::bigint, $3::text, $4::bigint)";

/// Records a step's output ($3 name, $4 output), fenced: only while the
/// workflow is still running under this owner ($5) and claim fence ($6) and
/// not being cancelled, the fence read under a row lock:
/// `shardq_step_record` (migrations/functions/shardq_step_record.sql).
/// One row, `recorded`: whether it is recorded (now, or before by this
/// claim: a record sent again keeps its first output).
pub const STEP_RECORD: &str = "SELECT shardq_step_record($1::int, $2::bigint, $3::text, \
    $4::jsonb, $5::text, $6::bigint) AS recorded";

/// A durable sleep ($3 the step's name): its wake time, recorded by the
/// first call as the shard's `now()` plus $6 µs, or $7 when given, and read
/// back by every later one; whether the shard's clock has passed it; and
/// whether this claim ($4 owner, $5 fence) still holds the workflow. While
/// it is not due, the workflow's `run_at` is set to it, so a `parked`
/// outcome makes the job ready then (`shardq_complete_many`). A due sleep
/// read back is a read; otherwise the workflow's row is locked first:
/// `shardq_step_sleep` (migrations/functions/shardq_step_sleep.sql).
pub const STEP_SLEEP: &str = "SELECT * FROM shardq_step_sleep($1::int, $2::bigint, $3::text, \
    $4::text, $5::bigint, $6::bigint, $7::timestamptz)";

/// Makes workflow ($1, $2), held by this claim ($3 owner, $4 fence), ready
/// again $5 ms (less up to a fifth, so that the callers of one outage do
/// not all come back at once) from the shard's `now()`, for a `parked`
/// outcome to keep (`shardq_complete_many`): a call to another shard that
/// did not answer. A time set during this run (`run_at` after the claim's
/// `started_at`: a wake by a message or a child's finish, due now; a wait's
/// recheck, later) is kept when sooner, not put off. No row when the claim
/// no longer holds it.
pub const RUN_AGAIN_IN: &str = "WITH retry AS (SELECT now() + $5::bigint \
        * (0.8 + random() * 0.2) * interval '1 millisecond' AS at) \
    UPDATE workflow_status SET run_at = CASE WHEN run_at > started_at \
        THEN least(run_at, retry.at) ELSE retry.at END \
    FROM retry \
    WHERE shard_key = $1 AND id = $2 AND owner = $3 AND fence = $4 AND status = 'running'";
