-- shardq_grouped_ready_turn: where p_queue's grouped claim may start its
-- walk: the lowest turn of a ready grouped job at or past the queue's
-- grouped floor (shardq_group_rounds); the floor itself when only grouped
-- jobs without a turn are ready (shardq_claim_grouped's walk then finds
-- none and says it was held back: the next move of the rounds numbers
-- them); NULL when no grouped job is ready. One walk of
-- workflow_status_ready_grouped from the floor, past what was claimed
-- since the floor last moved.
--
-- The claim's choice of path (shardq_claim) asks it, and the answer is
-- left in two transaction-local settings (shardq.grouped_from_queue and
-- shardq.grouped_from_turn) for shardq_claim_grouped, which starts its walk there
-- instead of walking the same entries from the floor a second time: under
-- a held horizon those are the dead entries of every job claimed since the
-- floor last moved. A job made ready after this read with a lower turn (a
-- producer that read the round before the last move, committing now) is
-- left to the next claim, whose read starts at the floor again.
CREATE OR REPLACE FUNCTION shardq_grouped_ready_turn(p_queue text) RETURNS bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    grouped_floor bigint;
    first_turn bigint;
BEGIN
    grouped_floor := coalesce((SELECT r.floor_turn FROM shardq_group_rounds r
                               WHERE r.queue = p_queue), 0);
    first_turn := (SELECT w.turn FROM workflow_status w
                   WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL
                     AND w.turn >= grouped_floor
                   ORDER BY w.turn LIMIT 1);
    IF first_turn IS NULL AND EXISTS (
            SELECT 1 FROM workflow_status w
            WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL
              AND w.turn IS NULL) THEN
        first_turn := grouped_floor;
    END IF;
    PERFORM set_config('shardq.grouped_from_queue', p_queue, true);
    PERFORM set_config('shardq.grouped_from_turn', coalesce(first_turn::text, ''), true);
    RETURN first_turn;
END $$;
