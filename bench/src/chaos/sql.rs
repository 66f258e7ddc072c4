//! Every statement of the chaos run, named after what it does.

/// The side-effect log of the chaos workflow: one row per time a step's
/// closure ran. No key on purpose: a repeated effect must show as a second row.
pub const EFFECTS_CREATE: &str = "CREATE TABLE IF NOT EXISTS chaos_effects ( \
    shard_key integer NOT NULL, \
    job_id bigint NOT NULL, \
    step text NOT NULL, \
    attempt integer NOT NULL, \
    applied_at timestamptz NOT NULL DEFAULT now())";

/// Records that step $3 of job ($1, $2) ran in attempt $4.
pub const EFFECT_INSERT: &str =
    "INSERT INTO chaos_effects (shard_key, job_id, step, attempt) VALUES ($1, $2, $3, $4)";

/// Kills every backend of application $1 except our own; one row per backend.
pub const TERMINATE_BACKENDS: &str = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
    WHERE application_name = $1 AND pid <> pg_backend_pid()";

/// Blocks every reader and writer of the queue table until the transaction ends.
pub const LOCK_QUEUE_TABLE: &str = "LOCK TABLE workflow_status IN ACCESS EXCLUSIVE MODE";

/// Rewrites the queue table under an ACCESS EXCLUSIVE lock.
pub const VACUUM_FULL_QUEUE_TABLE: &str = "VACUUM FULL workflow_status";

/// Jobs of the queues $1 on this shard: unfinished, succeeded, all,
/// finished (in any final state), ready now; seconds the most overdue
/// scheduled job is past its time (promotion lag) and the oldest expired
/// lease is past its expiry (recovery lag).
pub const QUEUE_PROGRESS: &str = "SELECT \
    count(*) FILTER (WHERE status IN ('waiting', 'scheduled', 'queued', 'running')), \
    count(*) FILTER (WHERE status = 'succeeded'), \
    count(*), \
    count(*) FILTER (WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled')), \
    count(*) FILTER (WHERE status = 'queued'), \
    greatest(0, extract(epoch FROM now() \
        - min(run_at) FILTER (WHERE status = 'scheduled')))::float8, \
    greatest(0, extract(epoch FROM now() \
        - min(lease_expires_at) FILTER (WHERE status = 'running')))::float8 \
    FROM workflow_status WHERE queue = ANY($1)";

/// The completion stall: row locks on every running job of this shard,
/// held until the transaction ends.
pub const LOCK_RUNNING_ROWS: &str =
    "SELECT id FROM workflow_status WHERE status = 'running' FOR UPDATE";

/// The torture run's log of keyed runs: one row per time the keyed handler
/// started an attempt, with when it started and finished (this server's
/// clock: every job of a key lives on one shard).
pub const RUNS_CREATE: &str = "CREATE TABLE IF NOT EXISTS torture_runs ( \
    run bigserial PRIMARY KEY, \
    queue text NOT NULL, \
    ordering_key text NOT NULL, \
    shard_key integer NOT NULL, \
    job_id bigint NOT NULL, \
    attempt integer NOT NULL, \
    by_design boolean NOT NULL, \
    pid integer NOT NULL, \
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(), \
    finished_at timestamptz, \
    claimed_at timestamptz, \
    error_at_start text)";

/// Records that attempt $5 of job ($3, $4) of queue $1, key $2, started in
/// worker process $7 ($6: it fails by design); returns the run. With it, the
/// job row as this attempt found it: when its claim was made (`started_at`:
/// the claim statement's time, the same for every job of one claim) and its
/// error (a failure of an earlier attempt that was written; a failure whose
/// worker died before writing it leaves none).
pub const RUN_START: &str = "INSERT INTO torture_runs \
    (queue, ordering_key, shard_key, job_id, attempt, by_design, pid, claimed_at, error_at_start) \
    SELECT $1::text, $2::text, $3::int, $4::bigint, $5::int, $6::boolean, $7::int, \
        w.started_at, w.error \
    FROM (SELECT 1) one LEFT JOIN workflow_status w ON w.shard_key = $3 AND w.id = $4 \
    RETURNING run";

/// What the keyed handler's failure by design says; a retry that finds it as
/// its job's error knows the failure was written.
pub const BY_DESIGN_MARK: &str = "fails its first attempt by design";

/// Records that run $1 finished.
pub const RUN_FINISH: &str =
    "UPDATE torture_runs SET finished_at = clock_timestamp() WHERE run = $1";

/// The runs whose order is a guarantee: the attempt that succeeded, and the
/// attempts that failed by design, finished, and whose failure was written
/// (a later attempt of the job found it as the job's error, $4 marks it):
/// their retry must come before the later jobs of their key. A failure by
/// design whose worker died before writing it is no failure of the job: the
/// job's lease expired and its attempt ran again, as did the attempts of the
/// earlier jobs that worker had run and not yet written. Other attempts
/// (killed, cut off) are not checked, nor are jobs whose payload number is
/// in $1 (an anti-join: the list can hold tens of thousands of numbers):
/// their enqueue was not acknowledged, so they may have committed after
/// later jobs (order is id order among committed jobs), nor runs of the
/// worker processes in $3: they were stopped past their lease. Each with the
/// job and finish of the run before it on its (queue, key), in start order,
/// and `rerun`: this run is the at-least-once re-run of a job whose earlier
/// attempt (not a failure by design) ran in the same claim as that previous
/// run, before it, and whose outcome was lost with that claim's worker, so
/// the previous run did not overtake it.
macro_rules! checked_runs {
    () => {
        "WITH checked AS ( \
            SELECT r.run, r.queue, r.ordering_key, r.shard_key, r.job_id, r.attempt, r.pid, \
                r.claimed_at, r.started_at, r.finished_at \
            FROM torture_runs r \
            JOIN workflow_status w ON w.shard_key = r.shard_key AND w.id = r.job_id \
            WHERE ((w.status = 'succeeded' AND r.attempt = w.attempts) \
               OR (r.by_design AND r.finished_at IS NOT NULL AND EXISTS ( \
                   SELECT 1 FROM torture_runs later WHERE later.shard_key = r.shard_key \
                       AND later.job_id = r.job_id AND later.attempt > r.attempt \
                       AND strpos(later.error_at_start, $4) > 0))) \
              AND r.pid <> ALL($3) \
              AND NOT EXISTS (SELECT 1 FROM unnest($1::bigint[]) AS u(n) \
                  WHERE u.n = (w.payload->>'n')::bigint) \
        ), lagged AS ( \
            SELECT *, lag(job_id) OVER k AS prev_job, lag(attempt) OVER k AS prev_attempt, \
                lag(finished_at) OVER k AS prev_finished, lag(started_at) OVER k AS prev_started, \
                lag(pid) OVER k AS prev_pid, lag(claimed_at) OVER k AS prev_claimed \
            FROM checked WINDOW k AS (PARTITION BY queue, ordering_key ORDER BY started_at, run) \
        ), ordered AS ( \
            SELECT l.*, EXISTS (SELECT 1 FROM torture_runs z \
                WHERE z.shard_key = l.shard_key AND z.job_id = l.job_id \
                    AND z.attempt < l.attempt AND NOT z.by_design \
                    AND z.pid = l.prev_pid AND z.claimed_at = l.prev_claimed \
                    AND z.started_at < l.prev_started) AS rerun \
            FROM lagged l \
        ) "
    };
}

/// Per-key order on this shard (`checked_runs` for $1, $3, $4). Columns: checked runs, runs that started
/// before an earlier-started run of a later job (out of id order), runs that
/// started before the previous run of their key finished (overlap), (job,
/// attempt) pairs that started twice, succeeded keyed jobs (handler $2)
/// without a finished run of their last attempt, distinct key strings,
/// keyed jobs that failed by design and were retried.
pub const ORDER_CHECKS: &str = concat!(
    checked_runs!(),
    "SELECT \
        (SELECT count(*) FROM checked), \
        (SELECT count(*) FROM ordered WHERE job_id < prev_job AND NOT rerun), \
        (SELECT count(*) FROM ordered WHERE started_at < prev_finished), \
        (SELECT count(*) FROM (SELECT job_id, attempt FROM torture_runs \
            GROUP BY 1, 2 HAVING count(*) > 1) twice), \
        (SELECT count(*) FROM workflow_status w WHERE w.handler = $2 AND w.status = 'succeeded' \
            AND NOT EXISTS (SELECT 1 FROM torture_runs r WHERE r.shard_key = w.shard_key \
                AND r.job_id = w.id AND r.attempt = w.attempts AND r.finished_at IS NOT NULL)), \
        (SELECT count(DISTINCT ordering_key) FROM workflow_status WHERE handler = $2), \
        (SELECT count(DISTINCT job_id) FROM torture_runs r WHERE by_design AND EXISTS ( \
            SELECT 1 FROM torture_runs later WHERE later.job_id = r.job_id \
                AND later.attempt > r.attempt))"
);

/// Up to $2 runs that broke per-key order (`checked_runs` for $1, $3, $4): queue, key, job, attempt, the
/// previous run's job and attempt, whether it overlapped that run.
pub const ORDER_VIOLATIONS: &str = concat!(
    checked_runs!(),
    "SELECT queue, ordering_key, job_id, attempt, prev_job, prev_attempt, \
        started_at < prev_finished \
    FROM ordered WHERE (job_id < prev_job AND NOT rerun) OR started_at < prev_finished \
    ORDER BY started_at LIMIT $2"
);

/// Every job of queue $1 on this shard: its key, id, payload number, handler,
/// status, attempts, the attempt its output says produced it, and its error.
pub const JOB_ROWS: &str = "SELECT shard_key, id, (payload->>'n')::bigint, handler, status, \
    attempts, (output->>'attempt')::int, error \
    FROM workflow_status WHERE queue = $1";

/// The common head of the step checks: `recorded` holds the recorded steps
/// of queue $1's workflows of handler $2 (the torture run's waiting
/// workflows share the queue and record other steps) with the attempt that
/// recorded them (a step's output is its attempt), `effects` the side
/// effects per (job, step, attempt).
macro_rules! recorded_and_effects {
    () => {
        "WITH recorded AS ( \
            SELECT s.shard_key, s.workflow_id, s.step_name, (s.output #>> '{}')::int AS attempt \
            FROM workflow_steps s \
            JOIN workflow_status w ON w.shard_key = s.shard_key AND w.id = s.workflow_id \
            WHERE w.queue = $1 AND w.handler = $2 \
        ), effects AS ( \
            SELECT shard_key, job_id, step, attempt, count(*) AS n \
            FROM chaos_effects GROUP BY 1, 2, 3, 4 \
        ) "
    };
}

/// Step bookkeeping of queue $1's workflows (handler $2, $3 steps each) on this
/// shard. Each side effect is compared with the attempt that recorded its
/// step: an effect of a later attempt means a step ran again after it had
/// been recorded; one of an earlier attempt is the at-least-once re-run of a
/// step whose record never landed. Columns: recorded steps, recorded steps
/// without an effect of their recording attempt, effects after the record,
/// steps re-run before their record, those re-runs' effects, effects of
/// never-recorded steps, (job, step, attempt) with several effects, succeeded
/// workflows without all steps recorded.
pub const STEP_CHECKS: &str = concat!(
    recorded_and_effects!(),
    ", matched AS ( \
        SELECT e.shard_key, e.job_id, e.step, e.attempt, e.n, r.attempt AS recorded_attempt \
        FROM effects e LEFT JOIN recorded r \
            ON r.shard_key = e.shard_key AND r.workflow_id = e.job_id AND r.step_name = e.step \
    ) \
    SELECT \
        (SELECT count(*) FROM recorded), \
        (SELECT count(*) FROM recorded r WHERE NOT EXISTS ( \
            SELECT 1 FROM effects e WHERE e.shard_key = r.shard_key AND e.job_id = r.workflow_id \
                AND e.step = r.step_name AND e.attempt = r.attempt)), \
        (SELECT coalesce(sum(n), 0)::bigint FROM matched WHERE attempt > recorded_attempt), \
        (SELECT count(*) FROM (SELECT DISTINCT shard_key, job_id, step FROM matched \
            WHERE attempt < recorded_attempt) rerun), \
        (SELECT coalesce(sum(n), 0)::bigint FROM matched WHERE attempt < recorded_attempt), \
        (SELECT coalesce(sum(n), 0)::bigint FROM matched WHERE recorded_attempt IS NULL), \
        (SELECT count(*) FROM effects WHERE n > 1), \
        (SELECT count(*) FROM workflow_status w \
            WHERE w.queue = $1 AND w.handler = $2 AND w.status = 'succeeded' \
            AND (SELECT count(*) FROM recorded r \
                 WHERE r.shard_key = w.shard_key AND r.workflow_id = w.id) <> $3)"
);

/// Up to $3 side effects of queue $1's workflows of handler $2 that break a
/// step invariant (a later attempt than the record, or several in one
/// attempt): key, job, step, attempt, how many, recording attempt.
pub const STEP_VIOLATIONS: &str = concat!(
    recorded_and_effects!(),
    "SELECT e.shard_key, e.job_id, e.step, e.attempt, e.n, r.attempt \
    FROM effects e LEFT JOIN recorded r \
        ON r.shard_key = e.shard_key AND r.workflow_id = e.job_id AND r.step_name = e.step \
    WHERE e.attempt > r.attempt OR e.n > 1 \
    ORDER BY 1, 2, 3, 4 LIMIT $3"
);

/// Self-check: a copy of the row of job n = $2 of queue $1 (two rows, one number).
pub const INJECT_DUPLICATE_ROW: &str = "INSERT INTO workflow_status \
    (shard_key, queue, handler, status, payload, attempts, output, finished_at) \
    SELECT shard_key, queue, handler, status, payload, attempts, output, finished_at \
    FROM workflow_status WHERE queue = $1 AND (payload->>'n')::bigint = $2";

/// Self-check: job n = $2 of queue $1 back in the queue (unfinished).
pub const INJECT_UNFINISHED: &str = "UPDATE workflow_status SET status = 'queued', \
    finished_at = NULL WHERE queue = $1 AND (payload->>'n')::bigint = $2";

/// Self-check: job n = $2 of queue $1 deleted (missing).
pub const INJECT_MISSING: &str =
    "DELETE FROM workflow_status WHERE queue = $1 AND (payload->>'n')::bigint = $2";

/// Self-check: a finished row of queue $1 whose number was never sent.
pub const INJECT_FOREIGN_ROW: &str = "INSERT INTO workflow_status \
    (shard_key, queue, handler, status, payload, finished_at) \
    VALUES (0, $1, 'noop', 'succeeded', '{\"n\": -1}', now())";

/// The self-check's victims: the succeeded workflow (queue $1, handler $2)
/// at offset $3 in id order on this shard.
macro_rules! victim {
    () => {
        "WITH victim AS ( \
            SELECT shard_key, id FROM workflow_status \
            WHERE queue = $1 AND handler = $2 AND status = 'succeeded' \
            ORDER BY id LIMIT 1 OFFSET $3) "
    };
}

/// Self-check: the victim's output names a later attempt than its last.
pub const INJECT_STALE_COMPLETION: &str = concat!(
    victim!(),
    "UPDATE workflow_status w SET output = jsonb_build_object('attempt', w.attempts + 1) \
    FROM victim v WHERE w.shard_key = v.shard_key AND w.id = v.id"
);

/// Self-check: step $4 of the victim applied again by a later attempt.
pub const INJECT_EFFECT_AFTER_RECORD: &str = concat!(
    victim!(),
    "INSERT INTO chaos_effects (shard_key, job_id, step, attempt) \
    SELECT s.shard_key, s.workflow_id, s.step_name, (s.output #>> '{}')::int + 1 \
    FROM workflow_steps s JOIN victim v ON s.shard_key = v.shard_key AND s.workflow_id = v.id \
    WHERE s.step_name = $4"
);

/// Self-check: step $4 of the victim applied twice by its recording attempt.
pub const INJECT_REPEATED_EFFECT: &str = concat!(
    victim!(),
    "INSERT INTO chaos_effects (shard_key, job_id, step, attempt) \
    SELECT s.shard_key, s.workflow_id, s.step_name, (s.output #>> '{}')::int \
    FROM workflow_steps s JOIN victim v ON s.shard_key = v.shard_key AND s.workflow_id = v.id \
    WHERE s.step_name = $4"
);

/// Self-check: the side effect of the victim's recorded step $4 removed.
pub const INJECT_LOST_EFFECT: &str = concat!(
    victim!(),
    "DELETE FROM chaos_effects e USING workflow_steps s, victim v \
    WHERE s.shard_key = v.shard_key AND s.workflow_id = v.id AND s.step_name = $4 \
        AND e.shard_key = s.shard_key AND e.job_id = s.workflow_id AND e.step = s.step_name \
        AND e.attempt = (s.output #>> '{}')::int"
);

/// Self-check: the record of the victim's step $4 removed.
pub const INJECT_MISSING_STEP: &str = concat!(
    victim!(),
    "DELETE FROM workflow_steps s USING victim v \
    WHERE s.shard_key = v.shard_key AND s.workflow_id = v.id AND s.step_name = $4"
);

/// The jobs of the scheduled ticks in queue $1, one row per tick (its dedup
/// id) with how many jobs it has and when (the server's clock) the first
/// was written.
pub const TICK_JOBS: &str = "SELECT dedup_id, count(*), min(created_at) \
    FROM workflow_status WHERE queue = $1 GROUP BY dedup_id";

/// The side-effect log of the torture run's waiting workflows and their children (`torture::waits`): one row
/// per time a closure ran. No key on purpose: a repeated effect must show as
/// a second row. `run` tells a workflow's handler invocations apart (0 for
/// a child, whose attempt does).
pub const WAIT_EFFECTS_CREATE: &str = "CREATE TABLE IF NOT EXISTS torture_wait_effects ( \
    shard_key integer NOT NULL, \
    job_id bigint NOT NULL, \
    step text NOT NULL, \
    attempt integer NOT NULL, \
    run bigint NOT NULL, \
    value jsonb NOT NULL, \
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp())";
