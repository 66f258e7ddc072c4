-- shardq_refuse_stale_snapshot: raises 40001 (serialization_failure) when
-- the calling transaction's snapshot was taken before the shard map last
-- changed on this shard (`shardq reshard`: an epoch recorded, a range
-- opened or released; their transaction id is in shardq_map_change_xid, a
-- sequence, read whatever the snapshot: migrations/0020_map_change_mark.sql).
-- Called by the epoch check and the hold trigger after the map's lock:
-- under READ COMMITTED each statement reads a fresh snapshot there, so it
-- never raises; under REPEATABLE READ or SERIALIZABLE it refuses a write by
-- a map the shard has left behind, to be run again.
CREATE OR REPLACE FUNCTION shardq_refuse_stale_snapshot()
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF NOT pg_visible_in_snapshot(
            (SELECT c.last_value FROM shardq_map_change_xid c)::text::xid8,
            pg_current_snapshot()) THEN
        RAISE EXCEPTION 'the shard map changed after this transaction''s snapshot was taken; '
            'nothing was written'
            USING ERRCODE = '40001',
                  HINT = 'run the transaction again';
    END IF;
END $$;
