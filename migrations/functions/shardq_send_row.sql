-- shardq_send_row: the send of a message to a workflow's mailbox, behind
-- shardq_send (SQL callers) and Client::send / JobContext::send (the Rust
-- client calls it directly: one round trip, one copy of the logic). Not
-- for callers: it refuses nothing with an error, it reports.
--
-- Returns one row: `status`, the workflow's status on this shard (NULL: no
-- such workflow here; a held stand-in, `held_status = 'running'`, the copy
-- of a job running on the shard its range moves from, is not the
-- workflow); `written`, whether the message was written (false with an
-- open status: its idempotency key was used before for this workflow);
-- `woken`, whether a recv of the workflow waited on the topic and was
-- woken. Only a workflow that has not finished nor is moving (`waiting`,
-- `scheduled`, `queued`, `running`) takes messages.
--
-- Two statements, under READ COMMITTED only (SQLSTATE 25000 otherwise,
-- nothing written): the first locks the recipient's row (`FOR NO KEY
-- UPDATE`: conflicts with a recv's `FOR UPDATE` and another send's lock,
-- not with the foreign key checks of the workflow's steps); the second,
-- a new snapshot in a volatile plpgsql function under READ COMMITTED,
-- sees every commit made before the lock was granted: a recv that
-- recorded its wait before the send got the lock is seen (and woken), and
-- a recv that waits for the send's lock sees the message once the send
-- commits. Under REPEATABLE READ or SERIALIZABLE the second statement
-- would read the transaction's first snapshot, taken maybe before that
-- recv committed: the send would miss the wait and leave the workflow
-- parked until its deadline (a lost wake-up), hence the refusal.
--
-- Between the two statements no writer changes what the second decides:
-- a recv (its take, its wait), another send, a completion, a
-- cancellation, a move's mark and the job's deletion all need a lock that
-- conflicts with the first's; only other workflows' rows change meanwhile.
--
-- The second statement writes the message ($3 topic, $4 message, $5
-- idempotency key or NULL) and wakes the workflow when one of its recv
-- steps waits on the topic: `run_at` is now, and a parked (`scheduled`)
-- workflow is queued at once, as the promotion of due jobs would
-- (`JOB_PROMOTE_DUE`, which says why): one without an ordering key freely,
-- a keyed one when the try of its key's lock succeeds (it never waits, so
-- it cannot deadlock with the row lock held); one whose key a claim holds
-- now is left due, for that promotion, within the maintenance interval. A
-- running one (its recv has not parked it yet) is parked due and promoted
-- the same way. Idle workers are notified of a job queued (at commit).
CREATE OR REPLACE FUNCTION shardq_send_row(p_shard_key int, p_workflow_id bigint,
    p_topic text, p_message jsonb, p_idempotency_key text)
RETURNS TABLE (status text, written boolean, woken boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    found_status text;
    was_written boolean;
    woken_status text;
    woken_queue text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'shardq_send needs READ COMMITTED, this transaction is %; nothing was written',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = '25000',
                  HINT = 'call it on its own or in a READ COMMITTED transaction: under a '
                         'transaction snapshot it could miss a recv waiting for the message '
                         'and leave the workflow asleep until its timeout';
    END IF;
    SELECT w.status INTO found_status FROM workflow_status w
        WHERE w.shard_key = p_shard_key AND w.id = p_workflow_id
          AND NOT (w.status = 'held' AND w.held_status = 'running')
        FOR NO KEY UPDATE;
    IF found_status IS NULL OR found_status NOT IN ('waiting', 'scheduled', 'queued', 'running') THEN
        RETURN QUERY SELECT found_status, false, false;
        RETURN;
    END IF;
    -- The status read under the lock cannot change before commit: the
    -- message goes in without looking again.
    WITH inserted AS MATERIALIZED (
        INSERT INTO workflow_messages (shard_key, workflow_id, topic, message, idempotency_key)
        VALUES (p_shard_key, p_workflow_id, p_topic, p_message, p_idempotency_key)
        ON CONFLICT (shard_key, workflow_id, idempotency_key)
            WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING seq
    ), waiting AS MATERIALIZED (
        SELECT 1 FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_workflow_id
            AND s.step_name LIKE 'shardq:recv:%:wait'
            AND s.output->>'topic' = p_topic AND EXISTS (SELECT 1 FROM inserted)
            AND NOT EXISTS (SELECT 1 FROM workflow_steps d
                WHERE d.shard_key = p_shard_key AND d.workflow_id = p_workflow_id
                    AND d.step_name = left(s.step_name, -length(':wait')))
        LIMIT 1
    ), woken AS MATERIALIZED (
        UPDATE workflow_status w SET run_at = now(),
            status = CASE WHEN w.status = 'scheduled' AND (w.ordering_key IS NULL
                    OR pg_try_advisory_xact_lock(shardq_key_lock(w.queue, w.ordering_key)))
                THEN 'queued' ELSE w.status END
        WHERE w.shard_key = p_shard_key AND w.id = p_workflow_id AND EXISTS (SELECT 1 FROM waiting)
            AND w.status IN ('scheduled', 'running') AND NOT w.cancel_requested
        RETURNING w.status, w.queue
    )
    SELECT EXISTS (SELECT 1 FROM inserted), k.status, k.queue
        INTO was_written, woken_status, woken_queue
        FROM (SELECT 1) AS one LEFT JOIN woken k ON true;
    IF woken_status = 'queued' THEN
        PERFORM pg_notify('shardq_ready', woken_queue);
    END IF;
    RETURN QUERY SELECT found_status, was_written, woken_status IS NOT NULL;
END $$;
