-- shardq:no-transaction
-- The per-key index serves only per-key reads. `workflow_status_key`
-- (queue, ordering_key, status, id) holds every unfinished keyed job; its
-- condition (a key, one of four states) is also implied by the probes for
-- ready keyed jobs (`status = 'queued' AND ordering_key IS NOT NULL`),
-- which `workflow_status_ready_keyed` serves from the queue's keyed floor.
-- A worker's session plans those probes once (generic plans), and planned
-- while few jobs were queued, both looked one row cheap: measured, a
-- session's "any keyed job ready?" probe walked the key index by queue and
-- status, every entry of every key of the queue, dead ones included
-- while a long transaction held vacuum back (the same tie as the grouped
-- indexes', migration 43).
--
-- So the key index carries `hashtext(ordering_key) IS NOT NULL` (true of
-- every keyed job): only a statement that states it can use the index:
-- the per-key reads (shardq_key_jobs_from), the waiting jobs' pages and
-- counts, `shardq check`, a range move's mark (is a key running?) and a
-- draining worker's "anything queued or waiting?" probe of a queue (one
-- walk of the queue's keyed entries, once per drain check). Built beside
-- the old one without blocking writes, then swapped in under the old name.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_key_by_hash
    ON workflow_status (queue, ordering_key, status, id)
    WHERE ordering_key IS NOT NULL
      AND status IN ('waiting', 'queued', 'running', 'scheduled')
      AND hashtext(ordering_key) IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS workflow_status_key;
ALTER INDEX IF EXISTS workflow_status_key_by_hash RENAME TO workflow_status_key;
