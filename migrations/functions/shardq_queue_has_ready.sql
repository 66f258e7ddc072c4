-- shardq_queue_has_ready: whether p_queue has a ready job of any kind on
-- this shard (plain, keyed or grouped): one probe of each dequeue index,
-- the plain one from each priority's ready floor (shardq_ready_floors), so
-- it does not walk what was claimed before under a held horizon.
-- For a claim that took fewer jobs than asked: ready jobs left means it
-- was held back, not caught up.
CREATE OR REPLACE FUNCTION shardq_queue_has_ready(p_queue text) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (SELECT 1 FROM shardq_ready_floors f
                   WHERE f.queue = p_queue AND EXISTS (
                       SELECT 1 FROM workflow_status w
                       WHERE w.queue = p_queue AND w.priority = f.priority
                         AND w.status = 'queued' AND w.ordering_key IS NULL
                         AND w.job_group IS NULL AND w.ready_seq >= f.floor_seq))
        OR EXISTS (SELECT 1 FROM workflow_status w
                   WHERE w.queue = p_queue AND w.status = 'queued'
                     AND w.ordering_key IS NOT NULL)
        OR EXISTS (SELECT 1 FROM workflow_status w
                   WHERE w.queue = p_queue AND w.status = 'queued'
                     AND w.job_group IS NOT NULL)
$$;
