-- shardq:no-transaction
-- Worker heartbeats and the dashboard's lists of failed jobs.
--
-- shardq_workers: one row per worker process per shard, upserted every few
-- seconds by the worker's heartbeat (src/worker/heartbeat.rs) with its
-- cumulative counters for this shard; the dashboard shows the live ones and
-- the lock-miss rate from them. Rows whose heartbeat stopped are deleted by
-- the next heartbeat of any worker, so the table holds about as many rows as
-- the fleet has processes. Not on the claim path: one small upsert per
-- process and shard every few seconds.
CREATE TABLE IF NOT EXISTS shardq_workers (
    worker_id    text        PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    queues       text[]      NOT NULL,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    -- Cumulative since the worker started, as seen on this shard.
    claims       bigint      NOT NULL DEFAULT 0,  -- claim statements that returned jobs
    claimed      bigint      NOT NULL DEFAULT 0,  -- jobs claimed
    busy         bigint      NOT NULL DEFAULT 0,  -- claims that found every dequeue slot taken
    empty        bigint      NOT NULL DEFAULT 0,  -- claims that found no ready job
    errors       bigint      NOT NULL DEFAULT 0,  -- claims that failed
    completed    bigint      NOT NULL DEFAULT 0   -- outcomes written
);

-- Dead, failed and cancelled jobs, newest first: the dashboard lists and
-- counts them without walking the succeeded history (which
-- workflow_status_finished holds too). Only a job that ends badly pays for
-- this index, never the claim and completion path of one that succeeds.
-- Built concurrently: the fleet keeps claiming while it builds.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_failed
    ON workflow_status (finished_at, id)
    WHERE status IN ('dead', 'failed', 'cancelled');
