-- Per-key ordering that no interleaving can break, without head-of-line stalls.
--
-- Ordering is per (queue, ordering key): the jobs of one key in one queue run
-- one at a time, in id order among the jobs committed when the key is taken.
--
-- States of a keyed job: 'queued' (ready, in the keyed dequeue index),
-- 'waiting' (parked behind another job of its key: not in any dequeue index,
-- so it never stands in front of runnable jobs), 'running', 'scheduled'.
-- A key is *held* while one of its jobs is running or scheduled (retrying or
-- delayed); a held key's queued jobs are parked as 'waiting' by the first
-- claim that meets them, and when the key is released its lowest waiting job
-- is queued again.
--
-- Every change to a key's jobs happens under the key's transaction-level
-- advisory lock (`shardq_key_lock`), taken *before* the statement that reads
-- the key's state, so that statement's snapshot sees every earlier change:
-- claims only try the lock (a claim never waits), everything else (complete,
-- release, recover, cancel, retry) waits for it, taking its keys in sorted
-- order. Enqueue takes no key lock: a new job is 'queued' and the claim that
-- meets it decides.

ALTER TABLE workflow_status DROP CONSTRAINT workflow_status_status_check;
ALTER TABLE workflow_status ADD CONSTRAINT workflow_status_status_check
    CHECK (status IN ('waiting', 'scheduled', 'queued', 'running',
                      'succeeded', 'failed', 'dead', 'cancelled'));

-- Fencing token: raised by every claim, never lowered (attempts is lowered by
-- a release and reset by a retry, so it cannot fence). Existing rows start
-- at 0 (no rewrite): only claims made from now on are fenced by it.
ALTER TABLE workflow_status ADD COLUMN fence bigint NOT NULL DEFAULT 0;

-- Two dequeue indexes: unkeyed ready jobs are claimed with SKIP LOCKED as
-- before; keyed ready jobs (key heads) are read apart, so keyed jobs never
-- crowd unkeyed ones out of a claim's candidates.
DROP INDEX workflow_status_dequeue;
CREATE INDEX workflow_status_dequeue
    ON workflow_status (queue, priority, id)
    WHERE status = 'queued' AND ordering_key IS NULL;
CREATE INDEX workflow_status_dequeue_keyed
    ON workflow_status (queue, priority, id)
    WHERE status = 'queued' AND ordering_key IS NOT NULL;

-- One key's unfinished jobs by state, in id order: every per-key question
-- (is it held? its lowest waiting job? its next jobs?) is one range probe.
DROP INDEX workflow_status_key_order;
CREATE INDEX workflow_status_key
    ON workflow_status (queue, ordering_key, status, id)
    WHERE ordering_key IS NOT NULL
      AND status IN ('waiting', 'queued', 'running', 'scheduled');

-- The functions this design needs (shardq_key_lock, shardq_lock_keys,
-- shardq_promote_keys and the claim, shardq_claim) were created here; their
-- current text is in migrations/functions/, applied after the migrations.
