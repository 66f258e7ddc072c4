//! Durable workflow steps.

/// The recorded output of one step (for tools and tests: a run reads its
/// whole log once, [`STEP_LOG`]).
#[cfg(feature = "internal")]
pub const STEP_GET: &str = "SELECT output FROM workflow_steps \
    WHERE shard_key = $1 AND workflow_id = $2 AND step_name = $3";

/// Every recorded step of a workflow ($1 shard key, $2 id), with whether
/// the claim ($3 owner, $4 fence) holds it and for how many more µs its
/// lease runs by the shard's clock (no other claim can take the workflow,
/// nor record a step of it, before then). One row per step; one row with
/// NULL step columns when none is recorded; no row when the workflow is
/// gone. Read by a run at its first step ([`crate::store::steps::log`]).
pub const STEP_LOG: &str = "SELECT s.step_name, s.output, w.held, w.lease_left_us \
    FROM (SELECT owner IS NOT DISTINCT FROM $3 AND fence = $4 AND status = 'running' AS held, \
            greatest(0, extract(epoch FROM lease_expires_at - clock_timestamp()) \
                * 1000000)::bigint AS lease_left_us \
        FROM workflow_status WHERE shard_key = $1 AND id = $2) w \
    LEFT JOIN workflow_steps s ON s.shard_key = $1 AND s.workflow_id = $2";

/// Records a step's output, fenced: only while the workflow is still running
/// under this owner ($5) and claim fence ($6) and not being cancelled. The
/// fence is read with a row lock, so it is the row's latest version (not the
/// statement's snapshot) and a recovery cannot commit between the check and
/// the insert. Returns a row when recorded (or already recorded).
///
/// A step this attempt recorded before (the reply was lost and the record is
/// sent again) also returns a row, and keeps its first output.
pub const STEP_RECORD: &str = "WITH owned AS MATERIALIZED ( \
        SELECT 1 FROM workflow_status \
        WHERE shard_key = $1 AND id = $2 \
            AND owner = $5 AND fence = $6 AND NOT cancel_requested \
        FOR SHARE \
    ), inserted AS ( \
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output) \
        SELECT $1, $2, $3, $4 WHERE EXISTS (SELECT 1 FROM owned) \
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING \
        RETURNING 1 \
    ) \
    SELECT 1 AS recorded FROM inserted \
    UNION ALL \
    SELECT 1 FROM workflow_steps \
    WHERE shard_key = $1 AND workflow_id = $2 AND step_name = $3 \
        AND EXISTS (SELECT 1 FROM owned) AND NOT EXISTS (SELECT 1 FROM inserted)";

/// A durable sleep ($3 the step's name): its wake time, recorded by the
/// first call as the shard's `now()` plus $6 µs, or $7 when given, and read
/// back by every later one; whether the shard's clock has passed it; and
/// whether this claim ($4 owner, $5 fence) still holds the workflow. While
/// it is not due, the workflow's `run_at` is set to it, so a `parked`
/// outcome makes the job ready then (`shardq_complete_many`).
///
/// A due sleep read back (the replay after the wake, the common call) is
/// a read: no row lock, no write, no transaction id. Its ownership and
/// cancellation are read from the statement's snapshot; a recovery or a
/// cancellation that commits after it is caught by the workflow's next
/// fenced write, as for a step returned from the log ([`STEP_GET`]).
///
/// Otherwise the workflow's row is locked first (the recorded step is read
/// in the statement's one snapshot): a recovery or a cancellation cannot
/// commit between the fence check and the writes; one that committed before
/// is seen (not owned: nothing is written).
pub const STEP_SLEEP: &str = "WITH recorded AS MATERIALIZED ( \
        SELECT (output->>'wake_at')::timestamptz AS wake_at FROM workflow_steps \
        WHERE shard_key = $1 AND workflow_id = $2 AND step_name = $3 \
    ), replay AS MATERIALIZED ( \
        SELECT 1 FROM recorded WHERE wake_at <= clock_timestamp() \
    ), seen AS MATERIALIZED ( \
        SELECT owner IS NOT DISTINCT FROM $4 AND fence = $5 AND status = 'running' AS held, \
            cancel_requested FROM workflow_status WHERE shard_key = $1 AND id = $2 \
    ), owned AS MATERIALIZED ( \
        SELECT 1 FROM workflow_status \
        WHERE shard_key = $1 AND id = $2 \
            AND owner = $4 AND fence = $5 AND NOT cancel_requested \
            AND NOT EXISTS (SELECT 1 FROM replay) \
        FOR UPDATE \
    ), inserted AS MATERIALIZED ( \
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output) \
        SELECT $1, $2, $3, jsonb_build_object('wake_at', \
            coalesce($7::timestamptz, now() + $6::bigint * interval '1 microsecond')) \
        WHERE EXISTS (SELECT 1 FROM owned) AND NOT EXISTS (SELECT 1 FROM recorded) \
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING \
        RETURNING (output->>'wake_at')::timestamptz AS wake_at \
    ), wake AS MATERIALIZED ( \
        SELECT wake_at FROM recorded UNION ALL SELECT wake_at FROM inserted \
    ), parked AS ( \
        UPDATE workflow_status w SET run_at = wake.wake_at FROM wake \
        WHERE w.shard_key = $1 AND w.id = $2 AND EXISTS (SELECT 1 FROM owned) \
            AND wake.wake_at > clock_timestamp() \
        RETURNING 1 \
    ) \
    SELECT wake.wake_at, coalesce(wake.wake_at <= clock_timestamp(), false) AS due, \
        EXISTS (SELECT 1 FROM owned) \
            OR (EXISTS (SELECT 1 FROM replay) AND coalesce((SELECT held AND NOT cancel_requested FROM seen), false)) AS owned, \
        (SELECT count(*) FROM parked) AS parked, \
        coalesce((SELECT cancel_requested FROM seen), false) AS cancelled \
    FROM (SELECT 1) AS one LEFT JOIN wake ON true";
