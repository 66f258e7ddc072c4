//! Durable workflow steps.

/// The recorded output of one step.
pub const STEP_GET: &str = "SELECT output FROM workflow_steps \
    WHERE shard_key = $1 AND workflow_id = $2 AND step_name = $3";

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
