-- Periodic jobs: one row per schedule, on the shard its name routes to
-- (the FNV-1a shard key of the name, as a deduplication id is routed).
-- `last_tick` is the latest tick handled: the tick statement moves it
-- forward only (`WHERE last_tick < $tick`) in the same statement that
-- enqueues the tick's job, so each tick is enqueued at most once across the
-- fleet even after that job has finished (the deduplication index covers
-- unfinished jobs only). A new table: nothing existing is locked.
CREATE TABLE IF NOT EXISTS shardq_schedules (
    name        text        PRIMARY KEY,
    last_tick   timestamptz NOT NULL,
    -- When `last_tick` last moved (for `shardq status`).
    updated_at  timestamptz NOT NULL DEFAULT now()
);
