-- shardq_hold_moving: the BEFORE INSERT trigger a shard carries while a
-- range moves in (`shardq reshard`, src/reshard/): a job whose shard key is
-- in a range moving to this shard is written `held` (its status kept in
-- held_status), so no worker claims it before the old shard has finished
-- the range's jobs claimed there; per key, the jobs copied from the old
-- shard (lower ids) then run before it.
--
-- A job whose id this shard gave before its ids were raised for the move
-- is refused with SQ004 (the Rust client routes it again with new ids).
--
-- A range still `closed` (the moving command copies its deduplication ids
-- and holds the move lock meanwhile): the insert waits for that lock, then
-- is refused with SQLSTATE SQ005 if the range is still closed (the command
-- stopped: run it again). The map's lock is taken shared, so the release of
-- a range (which takes it exclusive) never misses a row written held; a
-- transaction whose snapshot predates the map's last change (an open, a
-- release) is refused with 40001 (migrations/0020_map_change_mark.sql).
CREATE OR REPLACE FUNCTION shardq_hold_moving() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    piece_state text;
    first_id bigint;
    current_epoch int;
BEGIN
    IF NEW.status = 'held' THEN
        RETURN NEW;
    END IF;
    -- (maintenance_class(), MAP_SLOT) and (maintenance_class(), MOVE_SLOT):
    -- src/store/locks.rs.
    PERFORM pg_advisory_xact_lock_shared(-1457378061, 3);
    SELECT max(e.epoch) INTO current_epoch FROM shardq_map_epochs e;
    SELECT m.state, m.ids_from INTO piece_state, first_id FROM shardq_map_moves m
        WHERE m.epoch = current_epoch
          AND m.to_index = (SELECT s.shard_index FROM shardq_shard_map s)
          AND m.first_key <= NEW.shard_key AND NEW.shard_key < m.end_key;
    IF piece_state IS NULL OR piece_state = 'released' THEN
        RETURN NEW;
    END IF;
    -- An id taken before this shard's ids were raised for the move (a
    -- client reserves ids, then inserts): it would sort before the jobs
    -- copied from the old shard. The client takes new ids and routes again.
    IF NEW.id < first_id THEN
        RAISE EXCEPTION 'job id % was taken before shard_key % began moving to this shard; '
            'nothing was written', NEW.id, NEW.shard_key
            USING ERRCODE = 'SQ004',
                  DETAIL = format('epoch=%s', current_epoch),
                  HINT = 'take new ids (shardq_reserve_ids) and enqueue again';
    END IF;
    IF piece_state = 'closed' THEN
        PERFORM pg_advisory_xact_lock_shared(-1457378061, 4);
        SELECT m.state INTO piece_state FROM shardq_map_moves m
            WHERE m.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e)
              AND m.first_key <= NEW.shard_key AND NEW.shard_key < m.end_key;
    END IF;
    -- A snapshot taken before the map's last change (REPEATABLE READ,
    -- SERIALIZABLE) reads the range's state as it was: an opened range as
    -- closed, a released one as moving (written held, the job would stay
    -- held for good). Under READ COMMITTED each statement here reads after
    -- the locks above, so this never refuses there.
    PERFORM shardq_refuse_stale_snapshot();
    IF piece_state = 'closed' THEN
        RAISE EXCEPTION 'shard_key % is in a range moving to this shard, and the move stopped '
            'before it opened the range; nothing was written', NEW.shard_key
            USING ERRCODE = 'SQ005',
                  HINT = 'run `shardq reshard` again to finish the move, then retry';
    END IF;
    NEW.held_status := NEW.status;
    NEW.status := 'held';
    RETURN NEW;
END $$;
