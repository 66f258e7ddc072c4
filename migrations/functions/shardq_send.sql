-- shardq_send: sends a message on a topic to a workflow on this shard,
-- from any language, with the guarantees of the Rust client's
-- Client::send (shardq_send_row holds the send itself, which both call):
-- the message goes into the workflow's mailbox, where a recv of the topic
-- takes it (oldest first, each once); a workflow parked in a recv of the
-- topic is woken; with p_idempotency_key, a key used before for this
-- workflow writes nothing (`written` false), so a retry after an error or
-- a lost reply delivers the message once, even when the workflow has
-- finished or started moving since (the first send committed: the retry
-- reports the duplicate, not a refusal). Runs in the caller's
-- transaction (the message exists, and the workflow wakes, if it
-- commits), which must be READ COMMITTED (SQLSTATE 25000 otherwise).
-- Returns `written` (false: a duplicate of an idempotency key) and
-- `woken` (a waiting recv was woken). docs/enqueue-from-sql.md shows its
-- use.
--
-- Checks, as Client::send's (src/job.rs, validate_message): the topic 1
-- to 255 bytes, the idempotency key at most 1024 bytes, the message not
-- NULL and at most `shardq.max_payload_bytes` (default 1 MiB) as jsonb
-- text: SQLSTATE 22023, nothing written.
--
-- Refusals (nothing written): SQ006 when no workflow has this id on this
-- shard and its shard key is this shard's; SQ001 when it is not here and
-- the key is another shard's (the message names it: send there); SQ007
-- when the workflow has finished (succeeded, dead, cancelled) or is moving
-- between shards (`held`: send again after the move); DETAIL
-- `status=...`. A workflow found here takes the message whatever the map
-- says: during a move a running workflow stays on the shard it runs on
-- until it parks or ends, and its row there is the workflow (the Rust
-- client sends there too). Between shardq_send_row (which found no
-- workflow, so holds no lock and wrote nothing) and the route check, a
-- new epoch may be recorded: that changes only which refusal is raised.
CREATE OR REPLACE FUNCTION shardq_send(p_shard_key int, p_workflow_id bigint, p_topic text,
    p_message jsonb, p_idempotency_key text DEFAULT NULL)
RETURNS TABLE (written boolean, woken boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    -- The Rust client's limits (src/job.rs: MAX_QUEUE_BYTES, MAX_DEDUP_ID_BYTES).
    max_topic_bytes constant int := 255;
    max_key_bytes constant int := 1024;
    -- limits.max_payload_bytes by default.
    default_payload_bytes constant int := 1048576;
    max_payload int := COALESCE(NULLIF(current_setting('shardq.max_payload_bytes', true), '')::int,
                                default_payload_bytes);
    size int;
    sent record;
BEGIN
    IF p_topic IS NULL OR p_topic = '' THEN
        RAISE EXCEPTION 'topic name is empty' USING ERRCODE = '22023',
            HINT = 'give the topic the workflow''s recv waits on';
    END IF;
    IF octet_length(p_topic) > max_topic_bytes THEN
        RAISE EXCEPTION 'topic is % bytes, over the limit of % bytes; shorten it',
            octet_length(p_topic), max_topic_bytes USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_idempotency_key) > max_key_bytes THEN
        RAISE EXCEPTION 'idempotency key is % bytes, over the limit of % bytes; shorten it (a long key can be hashed)',
            octet_length(p_idempotency_key), max_key_bytes USING ERRCODE = '22023';
    END IF;
    IF p_message IS NULL THEN
        RAISE EXCEPTION 'message is NULL' USING ERRCODE = '22023',
            HINT = 'send a JSON value (the JSON null is ''null''::jsonb)';
    END IF;
    size := octet_length(p_message::text);
    IF size > max_payload THEN
        RAISE EXCEPTION 'message is % bytes, over limits.max_payload_bytes = %', size, max_payload
            USING ERRCODE = '22023',
                  HINT = 'send a smaller message (or a reference to the data), or raise the '
                         'limit with ALTER DATABASE ... SET shardq.max_payload_bytes';
    END IF;
    SELECT * INTO sent FROM shardq_send_row(p_shard_key, p_workflow_id, p_topic, p_message,
                                            p_idempotency_key);
    IF sent.status IS NULL THEN
        -- SQ001 naming the key's shard when it is not this one.
        PERFORM shardq_check_route(NULL, p_shard_key);
        RAISE EXCEPTION 'no workflow %-% on this shard; nothing was written', p_shard_key, p_workflow_id
            USING ERRCODE = 'SQ006',
                  HINT = 'check the id (`shardq job show`); while `shardq reshard` moves its '
                         'range, a running workflow stays on the shard that held it before';
    END IF;
    IF sent.status NOT IN ('waiting', 'scheduled', 'queued', 'running')
       AND p_idempotency_key IS NOT NULL
       AND EXISTS (SELECT 1 FROM workflow_messages m
                   WHERE m.shard_key = p_shard_key AND m.workflow_id = p_workflow_id
                     AND m.idempotency_key = p_idempotency_key) THEN
        RETURN QUERY SELECT false, false;
        RETURN;
    END IF;
    IF sent.status NOT IN ('waiting', 'scheduled', 'queued', 'running') THEN
        RAISE EXCEPTION 'workflow %-% is %, it takes no messages; nothing was written',
            p_shard_key, p_workflow_id, sent.status
            USING ERRCODE = 'SQ007',
                  DETAIL = format('status=%s', sent.status),
                  HINT = CASE WHEN sent.status = 'held'
                              THEN 'it is moving between shards: send again after the move'
                              ELSE 'a finished workflow receives nothing' END;
    END IF;
    RETURN QUERY SELECT sent.written, sent.woken;
END $$;
