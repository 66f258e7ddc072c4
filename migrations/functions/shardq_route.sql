-- shardq_route: where a job with routing key p_routing_key lives, by the
-- shard map recorded on this shard (shardq_shard_map, migration 5). Every
-- shard of a list records the same list, so any of them answers the same.
--
-- The routing key is the job's ordering key, else its deduplication id
-- (src/job.rs, NewJob::routing_key). NULL (a job with neither) draws a
-- uniformly random shard key, as the Rust client does: the caller enqueues
-- on the shard named (or on any shard: shardq_enqueue gives an unkeyed job
-- a random shard key of the shard it runs on).
--
-- shard_index = shard_key * shard_count / 65536 (src/router.rs,
-- shard_index). epoch is 1: today's one map. Resharding (issue 23) will
-- version the map; this function will then read the ranges of the current
-- epoch and return that epoch, with the same columns.
--
-- SQLSTATE SQ002: this shard records no map (`shardq migrate` never ran).
CREATE OR REPLACE FUNCTION shardq_route(p_routing_key text)
RETURNS TABLE (shard_key int, shard_index int, shard_count int, epoch int)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    k int;
    n int;
BEGIN
    SELECT m.shard_count INTO n FROM shardq_shard_map m;
    IF n IS NULL THEN
        RAISE EXCEPTION 'this shard records no shard map'
            USING ERRCODE = 'SQ002',
                  HINT = 'run `shardq migrate` with the full shard list first';
    END IF;
    k := CASE WHEN p_routing_key IS NULL THEN floor(random() * 65536)::int
              ELSE shardq_shard_key(p_routing_key) END;
    RETURN QUERY SELECT k, (k::bigint * n / 65536)::int, n, 1;
END $$;
