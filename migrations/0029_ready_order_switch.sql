-- Ready order (0027, 0028), switched on: the plain jobs ready now are
-- numbered and their queues get floors. The functions commit with this
-- migration (src/migrate/run.rs), among them the trigger that numbers
-- every job ready from now on (shardq_mark_ready) and the claims that
-- start at the floors: no job becomes ready between the two unnumbered.
UPDATE workflow_status SET ready_seq = nextval('shardq_ready_seq')
WHERE status = 'queued' AND ordering_key IS NULL AND job_group IS NULL AND ready_seq IS NULL;

INSERT INTO shardq_ready_floors (queue, priority)
SELECT DISTINCT queue, priority FROM workflow_status
WHERE status = 'queued' AND ordering_key IS NULL AND job_group IS NULL
ON CONFLICT DO NOTHING;

INSERT INTO shardq_ready_levels (queue, priority)
SELECT queue, priority FROM shardq_ready_floors
ON CONFLICT DO NOTHING;
