-- Group turns: grouped claims that walk one index range, as plain claims
-- do, instead of finding each group's head with an index probe of its own.
--
-- Every grouped job gets a `turn` each time it becomes ready: one past the
-- turn of its group's newest ready job of the same priority, and never
-- below the queue's current round (shardq_group_rounds). A claim takes
-- ready grouped jobs in (turn, priority, id) order: every group's first
-- turn, then every group's second, and so on, however many jobs a group
-- queued first. This is start-time fair queuing; the trigger that numbers
-- the turns is migrations/functions/shardq_take_turn.sql, the claim
-- shardq_claim_grouped.sql.
--
-- No default: existing rows keep NULL without a table rewrite; migration
-- 42 numbers the grouped jobs ready then.
ALTER TABLE workflow_status ADD COLUMN turn bigint;

-- Each queue's rounds, moved with the ready floors, by the same mover and
-- behind the same barrier (shardq_advance_ready_floors, at most every
-- 250 ms: each move is a row version, kept while the horizon is held):
-- - `round`: the lowest ready turn when last moved (none ready: a number
--   at or past every turn given). A group whose line is empty starts its
--   next job one past it: not behind everything the busy groups queued,
--   and not ahead of the round either.
-- - `floor_turn`: no ready grouped job of the queue has a lower turn, so
--   claims walk from here, not from the start of the index (where every
--   job claimed since the horizon was held leaves a dead entry).
-- - `noted_round`: the round when the barrier now pending was noted: the
--   floor may pass it once that barrier has passed (a producer that read
--   an older round may still be writing a turn below it until then).
CREATE TABLE shardq_group_rounds (
    queue text PRIMARY KEY,
    round bigint NOT NULL DEFAULT 0,
    floor_turn bigint NOT NULL DEFAULT 0,
    noted_round bigint
);
