-- shardq:no-transaction
-- Keyed ready order (0037): the keyed ready index ordered by the number,
-- built without blocking writes; the keyed jobs ready now numbered, ten
-- thousand to a transaction (rows a claim holds are left, so claims go
-- on), and their queues and priorities given floors. Keyed jobs that
-- become ready until the new functions commit, and those a claim held,
-- are numbered by migrations/functions/shardq_mark_ready.sql, under the
-- lock its trigger takes, in the transaction that writes the functions.
-- Until then the keyed floors stay at 0 (only the new functions move
-- them): a job numbered here, its number taken before its transaction's
-- id, is never behind a floor that moved past it.
--
-- workflow_status_dequeue_keyed stays: the functions written before this
-- run's last step read it, and the reads of queue depths and the
-- dashboard order by it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_ready_keyed
    ON workflow_status (queue, priority, ready_seq)
    WHERE status = 'queued' AND ordering_key IS NOT NULL;

DO $$
DECLARE
    numbered bigint;
BEGIN
    LOOP
        UPDATE workflow_status SET ready_seq = nextval('shardq_ready_seq')
        WHERE ctid = ANY (ARRAY(
            SELECT w.ctid FROM workflow_status w
            WHERE w.status = 'queued' AND w.ordering_key IS NOT NULL AND w.ready_seq IS NULL
            LIMIT 10000 FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS numbered = ROW_COUNT;
        COMMIT;
        EXIT WHEN numbered = 0;
    END LOOP;
END $$;

INSERT INTO shardq_ready_floors (queue, priority)
SELECT DISTINCT queue, priority FROM workflow_status
WHERE status = 'queued' AND ordering_key IS NOT NULL
ON CONFLICT DO NOTHING;

INSERT INTO shardq_ready_levels (queue, priority)
SELECT queue, priority FROM shardq_ready_floors
ON CONFLICT DO NOTHING;
