-- Workflow events (JobContext::set_event, Client::get_event and
-- JobContext::get_event, shardq_get_event): the latest value a workflow
-- published under each key, on its shard, readable before it ends. A new,
-- empty table: creating it (and its foreign key to workflow_status, whose
-- SHARE ROW EXCLUSIVE lock is held only for the catalog change, scanning
-- nothing) builds nothing.
--
-- One row per (workflow, key): a later set_event of the key replaces the
-- value (the set_event's step, recorded in the same statement, keeps a
-- replay from setting it again). A workflow's events go with it: deleted
-- with it (cascade), moved with it by `shardq reshard`.
CREATE TABLE workflow_events (
    shard_key    integer     NOT NULL,
    workflow_id  bigint      NOT NULL,
    key          text        NOT NULL,
    value        jsonb       NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (shard_key, workflow_id, key),
    FOREIGN KEY (shard_key, workflow_id) REFERENCES workflow_status (shard_key, id) ON DELETE CASCADE
) WITH (vacuum_truncate = false);
