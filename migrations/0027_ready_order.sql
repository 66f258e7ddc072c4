-- Ready order: claims that stay fast while a long transaction holds the
-- xmin horizon.
--
-- A claim updates its jobs out of the ready state. While any transaction
-- holds the horizon back (a report, pg_dump, a session idle in
-- transaction, a lagging replication slot), vacuum can remove none of the
-- ready versions left behind, and a claim that scans the ready index from
-- its start walks all of them: claims slow down with every job claimed
-- since, and the shard collapses ("Postgres Job Queues & Failure By MVCC").
--
-- So every plain job gets a `ready_seq` each time it becomes ready (a
-- number from one sequence: a retry, a release, a promotion is ready again
-- behind everything ready before it), the ready index is ordered by it, and
-- claims start at a floor per queue and priority (shardq_ready_floors)
-- below which no ready job can be: what was claimed before lies behind it.
-- shardq_advance_ready_floors (migrations/functions/) moves the floors up;
-- shardq_ready_barrier is its state between two moves.
--
-- A trigger numbers every plain job that becomes ready
-- (migrations/functions/shardq_mark_ready.sql); it is created with the
-- functions, at the end of migration 29, with the numbering of the jobs
-- ready before it.
CREATE SEQUENCE shardq_ready_seq;

-- No default: existing rows keep NULL, without a table rewrite; the ready
-- ones are numbered by migration 29.
ALTER TABLE workflow_status ADD COLUMN ready_seq bigint;

-- One row per queue and priority that has had a plain ready job on this
-- shard: no ready plain job of it has a ready_seq below floor_seq. A new
-- row starts at 0 (behind every number).
CREATE TABLE shardq_ready_floors (
    queue text NOT NULL,
    priority integer NOT NULL,
    floor_seq bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, priority)
);

-- The queues and priorities that have a floor, never updated: the
-- trigger looks here for each job it numbers. Its rows have one version
-- each, where a floor's row gets a new one at every move, all of them kept
-- while the horizon is held (a probe of the floors would walk them all).
CREATE TABLE shardq_ready_levels (
    queue text NOT NULL,
    priority integer NOT NULL,
    PRIMARY KEY (queue, priority)
);

-- The last floor move: the number and transaction id it took, for the
-- next move to wait on; one row.
CREATE TABLE shardq_ready_barrier (
    one_row boolean PRIMARY KEY DEFAULT true CHECK (one_row),
    pending_seq bigint,
    pending_xid xid8,
    advanced_at timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO shardq_ready_barrier DEFAULT VALUES;
