-- shardq_get_event: the value workflow p_shard_key-p_workflow_id on this
-- shard published under p_key (JobContext::set_event), or NULL while it
-- has not set it. A read: it never waits (poll it, or wait with
-- Client::get_event from Rust), and never blocks a writer. An event is
-- readable as soon as the set_event's transaction commits, before the
-- workflow ends, and after it ends until its row is removed by retention.
--
-- Refusals: SQ006 when no workflow has this id on this shard and its
-- shard key is this shard's; SQ001 when it is not here and the key is
-- another shard's (the message names it: ask there). A held stand-in (a
-- deduplicated job running on the shard its range moves from) is not the
-- workflow.
--
-- Two reads, each its own snapshot under READ COMMITTED: a retention that
-- removes the workflow between them makes the answer NULL (its events
-- went with it), and a set_event that commits between them is seen;
-- neither makes a wrong answer. Nothing is locked or written (the route
-- check, only for a workflow not here, takes the map's lock shared).
CREATE OR REPLACE FUNCTION shardq_get_event(p_shard_key int, p_workflow_id bigint, p_key text)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    event_value jsonb;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM workflow_status w
            WHERE w.shard_key = p_shard_key AND w.id = p_workflow_id
              AND NOT (w.status = 'held' AND w.held_status = 'running')) THEN
        PERFORM shardq_check_route(NULL, p_shard_key);
        RAISE EXCEPTION 'no workflow %-% on this shard', p_shard_key, p_workflow_id
            USING ERRCODE = 'SQ006',
                  HINT = 'check the id (`shardq job show`); while `shardq reshard` moves its '
                         'range, a running workflow stays on the shard that held it before';
    END IF;
    SELECT e.value INTO event_value FROM workflow_events e
        WHERE e.shard_key = p_shard_key AND e.workflow_id = p_workflow_id AND e.key = p_key;
    RETURN event_value;
END $$;
