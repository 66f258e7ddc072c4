//! Every statement of the waiting workflows ([`super::waits`]) and their
//! checks ([`super::waits_check`]).

/// Records that step $3 of job ($1, $2) ran in attempt $4, run $5, with $6.
pub const EFFECT_INSERT: &str = "INSERT INTO torture_wait_effects \
    (shard_key, job_id, step, attempt, run, value) VALUES ($1, $2, $3, $4, $5, $6)";

/// The claim of job ($1, $2) as its row says now: when it was made, the
/// shard's time, and whether an earlier attempt failed (its error).
pub const RUN_CLAIM: &str = "SELECT jsonb_build_object('claimed_at', started_at, \
    'at', clock_timestamp(), 'retry', error IS NOT NULL) \
    FROM workflow_status WHERE shard_key = $1 AND id = $2";

/// The waiting workflows (handler $1) of queues $2 on this shard.
macro_rules! waiting {
    () => {
        "WITH waiting AS MATERIALIZED ( \
            SELECT shard_key, id, (payload->>'n')::bigint AS n, status FROM workflow_status \
            WHERE handler = $1 AND queue = ANY($2)) "
    };
}

/// Per shard, one row of counts over the waiting workflows (`waiting!`).
/// Columns: workflows; succeeded; sleeps checked; sleeps passed before
/// their wake time by the shard's clock at the step after; sleeps passed
/// by a run claimed before the wake time (not a retry) that did not record
/// the sleep itself (a run whose sleep statement outlasted the sleep finds
/// it due at once and goes on, rightly); recorded effect
/// steps; recorded effect steps without exactly one effect of their run;
/// effects of runs whose record never landed; succeeded workflows without
/// both effect steps.
pub const SLEEP_AND_EFFECT_CHECKS: &str = concat!(
    waiting!(),
    ", slept AS ( \
        SELECT s.shard_key, s.workflow_id, (s.output->>'wake_at')::timestamptz AS wake_at, \
            (k.output->>'claimed_at')::timestamptz AS claimed_at, \
            (k.output->>'at')::timestamptz AS passed_at, (k.output->>'retry')::boolean AS retry, \
            s.created_at AS slept_at \
        FROM waiting w \
        JOIN workflow_steps s ON s.shard_key = w.shard_key AND s.workflow_id = w.id \
            AND s.step_name = 'shardq:sleep:1' \
        JOIN workflow_steps k ON k.shard_key = w.shard_key AND k.workflow_id = w.id \
            AND k.step_name = 'woke' \
    ), recorded AS ( \
        SELECT s.shard_key, s.workflow_id, s.step_name, (s.output->>'run')::bigint AS run \
        FROM waiting w JOIN workflow_steps s ON s.shard_key = w.shard_key \
            AND s.workflow_id = w.id AND s.step_name IN ('effect:before', 'gathered') \
    ) \
    SELECT (SELECT count(*) FROM waiting), \
        (SELECT count(*) FROM waiting WHERE status = 'succeeded'), \
        (SELECT count(*) FROM slept), \
        (SELECT count(*) FROM slept WHERE passed_at < wake_at), \
        (SELECT count(*) FROM slept \
            WHERE claimed_at < wake_at AND NOT retry AND slept_at < claimed_at), \
        (SELECT count(*) FROM recorded), \
        (SELECT count(*) FROM recorded r WHERE (SELECT count(*) FROM torture_wait_effects e \
            WHERE e.shard_key = r.shard_key AND e.job_id = r.workflow_id \
                AND e.step = r.step_name AND e.run = r.run) <> 1), \
        (SELECT count(*) FROM torture_wait_effects e JOIN recorded r \
            ON e.shard_key = r.shard_key AND e.job_id = r.workflow_id AND e.step = r.step_name \
            WHERE e.run <> r.run), \
        (SELECT count(*) FROM waiting w WHERE w.status = 'succeeded' AND (SELECT count(*) \
            FROM recorded r WHERE r.shard_key = w.shard_key AND r.workflow_id = w.id) <> 2)"
);

/// Up to $3 workflows (`waiting!`) that break a sleep or effect invariant:
/// key, id, n, what.
pub const SLEEP_AND_EFFECT_VIOLATIONS: &str = concat!(
    waiting!(),
    "SELECT w.shard_key, w.id, w.n, 'sleep passed early: wake ' || s.output::text \
        || ', run ' || k.output::text \
    FROM waiting w \
    JOIN workflow_steps s ON s.shard_key = w.shard_key AND s.workflow_id = w.id \
        AND s.step_name = 'shardq:sleep:1' \
    JOIN workflow_steps k ON k.shard_key = w.shard_key AND k.workflow_id = w.id \
        AND k.step_name = 'woke' \
    WHERE (k.output->>'at')::timestamptz < (s.output->>'wake_at')::timestamptz \
        OR ((k.output->>'claimed_at')::timestamptz < (s.output->>'wake_at')::timestamptz \
            AND NOT (k.output->>'retry')::boolean AND s.created_at < (k.output->>'claimed_at')::timestamptz) \
    UNION ALL \
    SELECT w.shard_key, w.id, w.n, 'step ' || s.step_name || ' recorded ' || s.output::text \
        || ' with effects ' || coalesce((SELECT string_agg(e.run::text, ',') \
            FROM torture_wait_effects e WHERE e.shard_key = s.shard_key \
            AND e.job_id = s.workflow_id AND e.step = s.step_name), 'none') \
    FROM waiting w JOIN workflow_steps s ON s.shard_key = w.shard_key \
        AND s.workflow_id = w.id AND s.step_name IN ('effect:before', 'gathered') \
    WHERE (SELECT count(*) FROM torture_wait_effects e WHERE e.shard_key = s.shard_key \
        AND e.job_id = s.workflow_id AND e.step = s.step_name \
        AND e.run = (s.output->>'run')::bigint) <> 1 \
    LIMIT $3"
);

/// The waiting workflows (`waiting!`) on this shard and what they
/// recorded of their children: key, id, n, status, each child's result
/// (`shardq:child:N:result` → its value), the gathered values.
pub const PARENT_ROWS: &str = concat!(
    waiting!(),
    "SELECT w.shard_key, w.id, w.n, w.status, \
        (SELECT jsonb_object_agg(s.step_name, s.output->'output'->'v') FROM workflow_steps s \
            WHERE s.shard_key = w.shard_key AND s.workflow_id = w.id \
            AND s.step_name LIKE 'shardq:child:%:result'), \
        (SELECT s.output->'value' FROM workflow_steps s WHERE s.shard_key = w.shard_key \
            AND s.workflow_id = w.id AND s.step_name = 'gathered') \
    FROM waiting w"
);

/// The children (handler $1) on this shard, wherever their parent lives:
/// parent key, parent id, parent n, child index, status, attempts, output
/// value, effects of the run that recorded its effect step ($2), times
/// that step is recorded, id.
pub const CHILD_ROWS: &str = "SELECT c.parent_shard_key, c.parent_id, \
        (c.payload->>'parent')::bigint, (c.payload->>'i')::bigint, c.status, c.attempts, \
        (c.output->>'v')::bigint, \
        (SELECT count(*) FROM torture_wait_effects e JOIN workflow_steps s \
            ON s.shard_key = e.shard_key AND s.workflow_id = e.job_id AND s.step_name = e.step \
            WHERE e.shard_key = c.shard_key AND e.job_id = c.id AND e.step = $2 \
            AND e.run = (s.output->>'run')::bigint), \
        (SELECT count(*) FROM workflow_steps s WHERE s.shard_key = c.shard_key \
            AND s.workflow_id = c.id AND s.step_name = $2), \
        c.id \
    FROM workflow_status c WHERE c.handler = $1";

/// The mailboxes of the waiting workflows (`waiting!`): one row per message
/// or recv step. Kind 'm': a message (topic, seq, its idempotency key, the
/// recv step that took it, the message). Kind 'r': a recv step (topic,
/// the seq it took or NULL when it timed out, its name, the message, and
/// whether it parked first: its wait was recorded).
pub const MAIL_ROWS: &str = concat!(
    waiting!(),
    "SELECT w.n, w.status, 'm', m.topic, m.seq, m.idempotency_key, m.received_by_step, \
        m.message, NULL::boolean \
    FROM waiting w JOIN workflow_messages m ON m.shard_key = w.shard_key AND m.workflow_id = w.id \
    UNION ALL \
    SELECT w.n, w.status, 'r', s.output->>'topic', (s.output->>'seq')::bigint, NULL, \
        s.step_name, s.output->'message', EXISTS (SELECT 1 FROM workflow_steps x \
            WHERE x.shard_key = s.shard_key AND x.workflow_id = s.workflow_id \
            AND x.step_name = s.step_name || ':wait') \
    FROM waiting w JOIN workflow_steps s ON s.shard_key = w.shard_key \
        AND s.workflow_id = w.id AND s.step_name LIKE 'shardq:recv:%' \
        AND s.step_name NOT LIKE '%:wait'"
);
