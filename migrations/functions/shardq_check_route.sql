-- shardq_check_route: the epoch fence of every enqueue. Refuses, before
-- anything is written, a write routed by a map other than this shard's
-- current one, or of a shard key this shard does not hold. Returns true
-- (so a statement can join it ahead of its insert: the insert then writes
-- nothing when it raises).
--
-- p_epoch: the epoch of the map the caller routed by; NULL takes this
-- shard's current (highest) epoch, for callers that route with
-- shardq_route in the same transaction. p_shard_keys: the keys to be
-- written here (VARIADIC: shardq_check_route(2, 17) or
-- shardq_check_route(2, VARIADIC keys)).
--
-- SQLSTATE SQ004 (stale shard map): p_epoch is older than the current
-- epoch, or unknown here; DETAIL 'epoch=N' names the current one; reload
-- the map (every shard's shardq_map_ranges at its highest epoch) and route
-- again: the refused call wrote nothing. SQ001: a key is not on this shard
-- at that epoch. SQ002: no map recorded (`shardq migrate` never ran).
--
-- Between its statements a new epoch may be recorded. Its writer (the
-- resharding to come) takes the exclusive transaction-level advisory lock
-- (maintenance class, MAP_SLOT = 3; src/store/locks.rs) before it writes
-- one; this function takes the shared one first, so an enqueue that passed the check commits
-- (or aborts) before a new epoch can be written, and one that waits for the
-- lock reads the epoch afterwards, in a later statement (a fresh snapshot
-- under READ COMMITTED). Under REPEATABLE READ or SERIALIZABLE the
-- snapshot is the transaction's: a caller whose snapshot was taken before
-- the map's last change (an epoch recorded, a range opened or released:
-- the transaction id in shardq_map_change_xid, a sequence, read whatever
-- the snapshot) is refused with 40001, to run the transaction again.
CREATE OR REPLACE FUNCTION shardq_check_route(p_epoch int, VARIADIC p_shard_keys int[])
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    current_epoch int;
    my_index int;
    held int4multirange;
    stray int;
    stray_index int;
BEGIN
    -- (maintenance_class(), MAP_SLOT): -1457378061 is the low 32 bits of
    -- FNV-1a 64 of 'shardq:maintenance' (src/store/locks.rs).
    PERFORM pg_advisory_xact_lock_shared(-1457378061, 3);
    PERFORM shardq_refuse_stale_snapshot();
    SELECT max(e.epoch) INTO current_epoch FROM shardq_map_epochs e;
    SELECT m.shard_index INTO my_index FROM shardq_shard_map m;
    IF current_epoch IS NULL OR my_index IS NULL THEN
        RAISE EXCEPTION 'this shard records no shard map' USING ERRCODE = 'SQ002',
            HINT = 'run `shardq migrate` with the full shard list first';
    END IF;
    IF p_epoch IS NOT NULL AND p_epoch <> current_epoch THEN
        RAISE EXCEPTION 'stale shard map: the write was routed by epoch %, this shard is at epoch %; nothing was written',
            p_epoch, current_epoch
            USING ERRCODE = 'SQ004',
                  DETAIL = format('epoch=%s', current_epoch),
                  HINT = 'reload the shard map (shardq_route, or shardq_map_ranges at the highest '
                         'epoch) and route the job again';
    END IF;
    -- This shard's keys as one multirange: each key's test is a binary
    -- search in memory, not an index probe (a 5,000-row insert checks
    -- 5,000 keys).
    SELECT COALESCE(range_agg(int4range(r.first_key, r.end_key)), '{}'::int4multirange)
        INTO held FROM shardq_map_ranges r
        WHERE r.epoch = current_epoch AND r.shard_index = my_index;
    SELECT k INTO stray FROM unnest(p_shard_keys) AS k WHERE NOT held @> k LIMIT 1;
    IF stray IS NOT NULL THEN
        SELECT r.shard_index INTO stray_index FROM shardq_map_ranges r
            WHERE r.epoch = current_epoch AND r.first_key <= stray AND stray < r.end_key;
        RAISE EXCEPTION 'shard_key % is on shard % at epoch %, not on this shard (%); nothing was written',
            stray, stray_index, current_epoch, my_index
            USING ERRCODE = 'SQ001',
                  DETAIL = format('shard_key=%s shard_index=%s epoch=%s', stray, stray_index,
                                  current_epoch),
                  HINT = format('enqueue it on shard %s', stray_index);
    END IF;
    RETURN true;
END $$;
