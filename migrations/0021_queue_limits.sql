-- Fleet-wide queue limits (`shardq limit set`), written on every shard so
-- that a process learns which queues are limited from any shard that
-- answers; permits and starts are taken from the first shard only (the
-- limits' home), under the limit row's lock (`shardq_lease_permits`,
-- `shardq_take_starts`). `revision` orders the writes (the newest one wins
-- when shards disagree after a write that reached only some of them).
CREATE TABLE shardq_queue_limits (
    queue text PRIMARY KEY,
    concurrency integer CHECK (concurrency > 0),
    rate_count integer CHECK (rate_count > 0),
    rate_period_ms integer CHECK (rate_period_ms > 0),
    revision bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- The rate's token bucket (home shard): tokens left as of tokens_at.
    tokens double precision NOT NULL DEFAULT 0,
    tokens_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL))
);

-- Permits a process holds, per queue, until `expires_at` (renewed every
-- half second by a running process; a killed one's lapse).
CREATE TABLE shardq_limit_leases (
    queue text NOT NULL,
    holder text NOT NULL,
    permits integer NOT NULL CHECK (permits >= 0),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue, holder)
);
