-- Cancel cascades owed: a workflow cancelled (by `Client::cancel` or its
-- deadline) owes its unfinished children, on any shard, their cancel.
-- The row is written in the cancel's own transaction and deleted once a
-- cascade over every shard its children live on has run to its end, so
-- a process that dies midway, a child's shard that does not answer, or a
-- child's key range being moved leaves the cascade owed, not forgotten:
-- the maintenance pass runs it again once `due_at` (the shard's clock)
-- has passed, and pushes `due_at` ahead while it runs (its lease).
--
-- `generation` (from the sequence, taken under the workflow's row lock, so
-- a later cancel of the same workflow has a greater one) says which
-- cancel the row stands for: a cascade pays only the generation it read
-- before it started, never a later cancel's.
CREATE SEQUENCE shardq_cascades_owed_generation;
CREATE TABLE shardq_cascades_owed (
    shard_key integer NOT NULL,
    id bigint NOT NULL,
    generation bigint NOT NULL,
    owed_since timestamptz NOT NULL DEFAULT now(),
    due_at timestamptz NOT NULL,
    PRIMARY KEY (shard_key, id)
);
CREATE INDEX shardq_cascades_owed_due ON shardq_cascades_owed (due_at);
CREATE INDEX shardq_cascades_owed_since ON shardq_cascades_owed (owed_since);
