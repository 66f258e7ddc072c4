-- shardq_queue_has_ready: the one "is anything ready" probe: whether
-- p_queue has a ready job on this shard of the kinds asked (p_plain: no
-- key, no group; p_keyed; p_grouped), leaving out the rows at p_taking
-- (those a claim has locked and is about to take). One probe of each
-- dequeue index asked, the plain and keyed ones from each priority's ready
-- floors (shardq_ready_floors), the grouped one from the queue's grouped
-- floor (shardq_group_rounds), so it does not walk what was claimed before
-- under a held horizon; the rows left out cost one more entry each at most.
-- Grouped jobs an upgrade left without a turn are found by a probe of the
-- grouped ready index's end (the claim's move of the rounds numbers them).
--
-- Used by the claim to choose its path (keyed or grouped jobs ready?) and
-- by a claim that took fewer jobs than asked: ready jobs left mean it was
-- held back, not caught up. plpgsql with one plan per connection: the
-- claim calls it on every claim.
CREATE OR REPLACE FUNCTION shardq_queue_has_ready(p_queue text,
    p_plain boolean DEFAULT true, p_keyed boolean DEFAULT true,
    p_grouped boolean DEFAULT true, p_taking tid[] DEFAULT '{}')
RETURNS boolean
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    f record;
    grouped_floor bigint;
BEGIN
    IF p_grouped THEN
        grouped_floor := coalesce((SELECT r.floor_turn FROM shardq_group_rounds r
                                   WHERE r.queue = p_queue), 0);
        IF EXISTS (
                SELECT 1 FROM workflow_status w
                WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL
                  AND w.turn >= grouped_floor AND w.ctid <> ALL (p_taking))
           OR EXISTS (
                SELECT 1 FROM workflow_status w
                WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL
                  AND w.turn IS NULL AND w.ctid <> ALL (p_taking)) THEN
            RETURN true;
        END IF;
    END IF;
    -- A loop, each probe with its floor as a value: as one statement
    -- (floors semi-joined to the jobs, with hash joins off) the planner may
    -- read the jobs first, from the start of the index.
    IF NOT (p_plain OR p_keyed) THEN
        RETURN false;
    END IF;
    FOR f IN SELECT fl.priority, fl.floor_seq, fl.keyed_floor_seq
             FROM shardq_ready_floors fl WHERE fl.queue = p_queue LOOP
        IF p_keyed AND EXISTS (
                SELECT 1 FROM workflow_status w
                WHERE w.queue = p_queue AND w.priority = f.priority
                  AND w.status = 'queued' AND w.ordering_key IS NOT NULL
                  AND w.ready_seq >= f.keyed_floor_seq
                  AND w.ctid <> ALL (p_taking)) THEN
            RETURN true;
        END IF;
        IF p_plain AND EXISTS (
                SELECT 1 FROM workflow_status w
                WHERE w.queue = p_queue AND w.priority = f.priority
                  AND w.status = 'queued' AND w.ordering_key IS NULL
                  AND w.job_group IS NULL AND w.ready_seq >= f.floor_seq
                  AND w.ctid <> ALL (p_taking)) THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END $$;
