//! Workflow events (`workflow_events`): the latest value a workflow
//! published under each key, and the reads of it.

/// A set_event step ($3 its name), fenced as [`STEP_RECORD`]: only while
/// the workflow is running under this owner ($6) and claim fence ($7) and
/// not being cancelled; the fence is read with a row lock (`FOR SHARE`),
/// so a recovery or a cancellation cannot commit between the check and
/// the writes, and one that committed before is seen. One statement, so
/// one transaction: the step is recorded and the event ($4 key, $5 value)
/// written together, and only by the call that records the step; a replay
/// (the step recorded before) writes nothing, so the value a later
/// set_event of the key wrote stays (the last in code order wins). Returns
/// whether the claim holds the workflow (`owned`), whether this call wrote
/// (`written`), and whether its cancellation was asked.
///
/// [`STEP_RECORD`]: super::STEP_RECORD
pub const EVENT_SET: &str = "WITH owned AS MATERIALIZED ( \
        SELECT 1 FROM workflow_status \
        WHERE shard_key = $1 AND id = $2 \
            AND owner = $6 AND fence = $7 AND NOT cancel_requested \
        FOR SHARE \
    ), step AS MATERIALIZED ( \
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output) \
        SELECT $1, $2, $3, jsonb_build_object('key', $4::text) \
        WHERE EXISTS (SELECT 1 FROM owned) \
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING \
        RETURNING 1 \
    ), event AS MATERIALIZED ( \
        INSERT INTO workflow_events (shard_key, workflow_id, key, value) \
        SELECT $1, $2, $4, $5 FROM step \
        ON CONFLICT (shard_key, workflow_id, key) \
            DO UPDATE SET value = excluded.value, updated_at = now() \
        RETURNING 1 \
    ) \
    SELECT EXISTS (SELECT 1 FROM owned) AS owned, EXISTS (SELECT 1 FROM event) AS written, \
        EXISTS (SELECT 1 FROM workflow_status \
                WHERE shard_key = $1 AND id = $2 AND cancel_requested) AS cancelled";

/// The event $3 of workflow ($1 shard key, $2 id): one row when the
/// workflow is on this shard (a held stand-in, the copy of a job running on
/// the shard its range moves from, is not the workflow), its `value` NULL
/// while the key is not set. A plain read: it locks nothing.
pub const EVENT_GET: &str = "SELECT e.value FROM workflow_status w \
    LEFT JOIN workflow_events e \
        ON e.shard_key = w.shard_key AND e.workflow_id = w.id AND e.key = $3 \
    WHERE w.shard_key = $1 AND w.id = $2 AND NOT (w.status = 'held' AND w.held_status = 'running')";
