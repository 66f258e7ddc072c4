-- shardq_route: where a job with routing key p_routing_key lives, by the
-- current (highest) epoch of the shard map recorded on this shard
-- (shardq_map_ranges, migration 17). Every shard of a list records the
-- same map, so any of them answers the same (during a move, one may be an
-- epoch behind: the shard written to fences by its own epoch, SQ004).
--
-- The routing key is the job's ordering key, else its deduplication id
-- (src/job.rs, NewJob::routing_key). NULL (a job with neither) draws a
-- uniformly random shard key, as the Rust client does: the caller enqueues
-- on the shard named (or on any shard: shardq_enqueue gives an unkeyed job
-- a random shard key of the shard it runs on).
--
-- shard_index: the shard whose range at the current epoch holds the key
-- (at epoch 1 that is shard_key * shard_count / 65536, src/router.rs);
-- epoch: that epoch, to pass to shardq_enqueue's p_epoch so the write is
-- refused (SQ004) if the map changed in between.
--
-- SQLSTATE SQ002: this shard records no map (`shardq migrate` never ran).
CREATE OR REPLACE FUNCTION shardq_route(p_routing_key text)
RETURNS TABLE (shard_key int, shard_index int, shard_count int, epoch int)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    k int;
    current_epoch int;
    n int;
BEGIN
    SELECT e.epoch, e.shard_count INTO current_epoch, n FROM shardq_map_epochs e
        ORDER BY e.epoch DESC LIMIT 1;
    IF current_epoch IS NULL THEN
        RAISE EXCEPTION 'this shard records no shard map'
            USING ERRCODE = 'SQ002',
                  HINT = 'run `shardq migrate` with the full shard list first';
    END IF;
    k := CASE WHEN p_routing_key IS NULL THEN floor(random() * 65536)::int
              ELSE shardq_shard_key(p_routing_key) END;
    RETURN QUERY SELECT k, r.shard_index, n, current_epoch FROM shardq_map_ranges r
        WHERE r.epoch = current_epoch AND r.first_key <= k AND k < r.end_key;
END $$;
