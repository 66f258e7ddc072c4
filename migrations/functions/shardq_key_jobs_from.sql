-- shardq_key_jobs_from: a per-key read's test, "of status p_want, id
-- p_from or above" (a key's running, scheduled, queued or waiting jobs
-- from its floor on: shardq_claim_keyed, shardq_promote_keys), written so
-- that only workflow_status_key (queue, ordering_key, status, id) serves
-- it, and its walk starts at (p_want, p_from). Pass the row's ordering
-- key, status and id.
--
-- Written `status = 'running' AND id >= p_from`, the test is also implied
-- by the predicates of the lease index (every running job of the queue) and
-- of the scheduled and ready indexes; with one row estimated either way,
-- the planner picked among them by chance, and those walk every dead
-- version of the queue while a long transaction holds vacuum back. Its
-- predicate prover does not derive `status = 'running'` from a range,
-- which keeps those out; the IN list and the hashtext test imply the key
-- index's own predicate (migration 45). The lower bound is a row
-- comparison: a plain `status >= 'queued'` is implied by that predicate
-- under the C collation (queued sorts first), so the planner drops it, and
-- the walk would start at the key's first entry. Inlined where it is used
-- (one SQL expression), so the planner sees the conditions themselves.
-- tests/it/key_floors.rs counts the entries the reads walk.
CREATE OR REPLACE FUNCTION shardq_key_jobs_from(p_key text, p_status text, p_id bigint,
                                                p_want text, p_from bigint) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT (p_status, p_id) >= (p_want, p_from) AND p_status <= p_want
             AND p_status IN ('waiting', 'queued', 'running', 'scheduled')
             AND hashtext(p_key) IS NOT NULL $$;
