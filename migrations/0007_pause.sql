-- Pausing queues, and a cheaper claim of unkeyed jobs.
--
-- A paused queue (a row in shardq_paused_queues, on every shard) is claimed
-- by no worker: the claim answers "empty" at once. Enqueue, running jobs and
-- their completions go on; resuming deletes the row and notifies
-- `shardq_ready`, so idle workers claim again at once.
--
-- This version also gave the claim (migrations/functions/shardq_claim.sql)
-- the pause check first and a fast path: when the queue has no keyed job
-- ready, the unkeyed jobs are locked and updated in one statement instead of
-- going through the key bookkeeping's arrays (which probed every claimed row
-- twice more).

CREATE TABLE shardq_paused_queues (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);
