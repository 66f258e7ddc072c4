-- shardq schema, version 1: the job and step tables as first created.
-- Applied to every shard by `shardq migrate`; later migrations change them
-- (migrations/schema.sql shows the current schema of a migrated shard).
-- Every table's primary key holds shard_key: a router (PgDog, Citus) can
-- route each statement by it, and every statement stays on one shard. (Here
-- it leads the key; migration 13 puts the id first, for inserts' sake.)

CREATE TABLE workflow_status (
    shard_key        integer     NOT NULL CHECK (shard_key BETWEEN 0 AND 65535),
    id               bigint      GENERATED ALWAYS AS IDENTITY,
    queue            text        NOT NULL,
    handler          text        NOT NULL,
    ordering_key     text,
    priority         integer     NOT NULL DEFAULT 0,
    status           text        NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'running', 'succeeded', 'failed')),
    payload          jsonb       NOT NULL DEFAULT '{}',
    output           jsonb,
    error            text,
    attempts         integer     NOT NULL DEFAULT 0,
    owner            text,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    PRIMARY KEY (shard_key, id)
) WITH (
    -- Room on each page for the claim and completion updates.
    fillfactor = 70,
    -- A vacuum that truncates the empty tail takes ACCESS EXCLUSIVE and stalls every claimer.
    vacuum_truncate = false,
    -- A queue table churns; vacuum it long before the default 20% of dead rows.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.05
);

-- Exactly the dequeue predicate and order: WHERE queue = $1 AND status = 'queued'
-- ORDER BY priority, id. Finished and running rows are not in it, so the claim
-- never walks past history.
CREATE INDEX workflow_status_dequeue
    ON workflow_status (queue, priority, id)
    WHERE status = 'queued';

-- Lease recovery scans only running rows.
CREATE INDEX workflow_status_lease
    ON workflow_status (lease_expires_at)
    WHERE status = 'running';

CREATE TABLE workflow_steps (
    shard_key    integer     NOT NULL,
    workflow_id  bigint      NOT NULL,
    step_name    text        NOT NULL,
    output       jsonb,
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (shard_key, workflow_id, step_name),
    FOREIGN KEY (shard_key, workflow_id) REFERENCES workflow_status (shard_key, id) ON DELETE CASCADE
) WITH (vacuum_truncate = false);
