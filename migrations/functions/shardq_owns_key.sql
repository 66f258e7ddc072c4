-- shardq_owns_key: whether this shard holds shard key p_shard_key at its
-- current epoch, and the key's range is not `closed` on its way in (`shardq
-- reshard` copies state such as a schedule's last tick then). The fence of
-- a schedule's tick: a tick runs only where its key lives.
--
-- It takes the map's lock shared first (maintenance class, MAP_SLOT = 3;
-- src/store/locks.rs), and reads the map after it (under READ COMMITTED a
-- volatile function's statements read fresh snapshots): a tick that passed
-- commits before a new epoch can be recorded, and one that waited reads
-- the new epoch. Without it, a tick whose statement began before the epoch
-- was written could commit on the old shard after the range's schedules
-- were copied, and the same tick run again on the new shard.
CREATE OR REPLACE FUNCTION shardq_owns_key(p_shard_key int)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(-1457378061, 3);
    RETURN EXISTS (SELECT 1 FROM shardq_map_ranges r
            WHERE r.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e)
              AND r.shard_index = (SELECT m.shard_index FROM shardq_shard_map m)
              AND r.first_key <= p_shard_key AND p_shard_key < r.end_key)
        AND NOT EXISTS (SELECT 1 FROM shardq_map_moves v
            WHERE v.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e)
              AND v.state = 'closed' AND v.first_key <= p_shard_key
              AND p_shard_key < v.end_key);
END $$;
