//! Reading one job. A held stand-in (`status = 'held'`, `held_status =
//! 'running'`: the deduplication id of a job still running on the shard its
//! range moves from, `shardq reshard`) is not the job: these reads pass over
//! it, so the caller goes on to the shard where the job runs.

/// One job by key.
pub const JOB_GET: &str = "SELECT queue, handler, ordering_key, priority, status, payload, \
    output, error, attempts, max_attempts, owner, dedup_id, job_group, cancel_requested, \
    created_at::text AS created_at, run_at::text AS run_at, \
    started_at::text AS started_at, finished_at::text AS finished_at, \
    deadline_at::text AS deadline_at, \
    CASE WHEN status = 'scheduled' AND EXISTS (SELECT 1 FROM workflow_steps s \
            WHERE s.shard_key = w.shard_key AND s.workflow_id = w.id \
                AND s.step_name LIKE 'shardq:sleep:%' \
                AND (s.output->>'wake_at')::timestamptz = w.run_at) \
        THEN 'a durable sleep, until ' || run_at::text \
        WHEN status = 'scheduled' AND EXISTS (SELECT 1 FROM workflow_steps s \
            WHERE s.shard_key = w.shard_key AND s.workflow_id = w.id \
                AND s.step_name LIKE 'shardq:child:%:wait' \
                AND NOT EXISTS (SELECT 1 FROM workflow_steps d \
                    WHERE d.shard_key = w.shard_key AND d.workflow_id = w.id \
                        AND d.step_name = left(s.step_name, -length(':wait')))) \
        THEN (SELECT 'child workflow ' || (s.output->>'child_shard_key') || '-' \
                || (s.output->>'child_id') \
            FROM workflow_steps s \
            WHERE s.shard_key = w.shard_key AND s.workflow_id = w.id \
                AND s.step_name LIKE 'shardq:child:%:wait' \
                AND NOT EXISTS (SELECT 1 FROM workflow_steps d \
                    WHERE d.shard_key = w.shard_key AND d.workflow_id = w.id \
                        AND d.step_name = left(s.step_name, -length(':wait'))) \
            LIMIT 1) \
        WHEN status = 'scheduled' THEN (SELECT 'a message on topic `' || (s.output->>'topic') \
                || '`, until ' || (s.output->>'deadline')::timestamptz::text \
            FROM workflow_steps s \
            WHERE s.shard_key = w.shard_key AND s.workflow_id = w.id \
                AND s.step_name LIKE 'shardq:recv:%:wait' \
                AND NOT EXISTS (SELECT 1 FROM workflow_steps d \
                    WHERE d.shard_key = w.shard_key AND d.workflow_id = w.id \
                        AND d.step_name = left(s.step_name, -length(':wait'))) \
            LIMIT 1) \
        END AS waiting_for \
    FROM workflow_status w WHERE shard_key = $1 AND id = $2 \
        AND NOT (status = 'held' AND held_status = 'running')";

/// The status, output and error of one job.
pub const JOB_OUTCOME: &str = "SELECT status, output, error FROM workflow_status \
    WHERE shard_key = $1 AND id = $2 AND NOT (status = 'held' AND held_status = 'running')";

/// Which of the jobs (`$1` ids, `$2` shard keys, `$3` queues, `$4`
/// handlers, `$5` payloads, `$6` ordering keys, pairwise) this shard holds
/// as given: their ids (one primary-key probe each). A row under the same
/// id and shard key with other content is another job: one a move copied
/// here from the shard that gave it that id (each shard numbers its jobs
/// itself), not this one.
pub const JOBS_PRESENT: &str = "SELECT t.id \
    FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::text[], $6::text[]) \
        AS t(id, shard_key, queue, handler, payload, ordering_key) \
    WHERE EXISTS (SELECT 1 FROM workflow_status w WHERE w.id = t.id AND w.shard_key = t.shard_key \
        AND w.queue = t.queue AND w.handler = t.handler AND w.payload = t.payload::jsonb \
        AND w.ordering_key IS NOT DISTINCT FROM t.ordering_key)";

/// Whether this shard holds job (`$1` shard key, `$2` id): finds the shard of
/// a job written under an older shard map (one primary-key probe).
pub const JOB_EXISTS: &str = "SELECT 1 FROM workflow_status WHERE shard_key = $1 AND id = $2 \
    AND NOT (status = 'held' AND held_status = 'running')";
