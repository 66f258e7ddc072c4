-- Messages to a workflow (Client::send, JobContext::send and recv): its
-- mailbox, on its shard. A new, empty table: creating it (and its foreign
-- key to workflow_status, whose SHARE ROW EXCLUSIVE lock is held only for
-- the catalog change, scanning nothing) and its indexes builds nothing.
--
-- `seq` is the shard's order of the messages (an identity: the database's
-- order, never a writer's clock): a topic's messages are received oldest
-- `seq` first. `received_by_step` is the recv step that took a message
-- (NULL while it waits in the mailbox). A workflow's messages go with it:
-- deleted with it (cascade), moved with it by `shardq reshard`.
CREATE TABLE workflow_messages (
    shard_key         integer     NOT NULL,
    workflow_id       bigint      NOT NULL,
    seq               bigint      GENERATED ALWAYS AS IDENTITY,
    topic             text        NOT NULL,
    message           jsonb       NOT NULL,
    idempotency_key   text,
    received_by_step  text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (shard_key, workflow_id, seq),
    FOREIGN KEY (shard_key, workflow_id) REFERENCES workflow_status (shard_key, id) ON DELETE CASCADE
) WITH (vacuum_truncate = false);

-- A recv's lookup: the oldest message of a topic not yet received.
CREATE INDEX workflow_messages_unreceived
    ON workflow_messages (shard_key, workflow_id, topic, seq)
    WHERE received_by_step IS NULL;

-- A send with an idempotency key already used for the workflow is a no-op.
CREATE UNIQUE INDEX workflow_messages_idempotency
    ON workflow_messages (shard_key, workflow_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
