-- Groups (a tenant, an account, an API key): a job's optional `job_group`,
-- set at enqueue. A job with a group and no ordering key is placed by its
-- group, so all of a group's jobs share a shard and its limits are counted
-- there. Claims take turns among the groups with ready jobs
-- (shardq_claim_grouped). The indexes follow in 0023 (built without
-- blocking writes), the SQL enqueue's new signature in 0024.
ALTER TABLE workflow_status ADD COLUMN job_group text;
-- A key already runs its jobs one at a time in order and places them; a
-- group would place them too: a job has one or the other (the enqueue
-- paths refuse both; this keeps any other writer out).
ALTER TABLE workflow_status ADD CONSTRAINT workflow_status_key_or_group
    CHECK (ordering_key IS NULL OR job_group IS NULL) NOT VALID;
ALTER TABLE workflow_status VALIDATE CONSTRAINT workflow_status_key_or_group;

-- Limits every group of a queue has (each group on its own): written with
-- the queue's other limits on every shard, read by the claim on its shard.
ALTER TABLE shardq_queue_limits
    ADD COLUMN group_concurrency integer,
    ADD COLUMN group_rate_count integer,
    ADD COLUMN group_rate_period_ms integer;
ALTER TABLE shardq_queue_limits ADD CONSTRAINT shardq_queue_limits_group_check
    CHECK (group_concurrency > 0 AND group_rate_count > 0 AND group_rate_period_ms > 0
           AND (group_rate_count IS NULL) = (group_rate_period_ms IS NULL)) NOT VALID;
ALTER TABLE shardq_queue_limits VALIDATE CONSTRAINT shardq_queue_limits_group_check;

-- Each group's start-rate token bucket, on the group's shard (taken under
-- the group's lock by the claim). A row whose bucket is full again says
-- nothing a missing row does not; upkeep deletes those.
CREATE TABLE shardq_group_tokens (
    queue text NOT NULL,
    job_group text NOT NULL,
    tokens double precision NOT NULL,
    tokens_at timestamptz NOT NULL,
    PRIMARY KEY (queue, job_group)
);
