-- shardq_refuse_stale_snapshot: raises 40001 (serialization_failure) when
-- the calling transaction's snapshot was taken before the shard map last
-- changed on this shard (`shardq reshard`: an epoch recorded, a range
-- opened or released; their transaction id is in shardq_map_change_xid, a
-- sequence, read whatever the snapshot: migrations/0020_map_change_mark.sql).
-- Called by the epoch check and the hold trigger after the map's lock:
-- under REPEATABLE READ or SERIALIZABLE it refuses a write by a map the
-- shard has left behind, to be run again. Under READ COMMITTED it does
-- nothing: each statement there reads a fresh snapshot after the locks
-- that order it with every change of the map (the map's lock for an
-- epoch and a release, the move lock for an opening), so its reads are
-- never stale. Checking anyway refused enqueues at random: an opening
-- marks its transaction before it commits, and an enqueue that read the
-- mark in that instant saw a change its snapshot could not show yet
-- (40001 on a plain enqueue during a move, seen in
-- tests/it/reshard.rs).
CREATE OR REPLACE FUNCTION shardq_refuse_stale_snapshot()
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        RETURN;
    END IF;
    IF NOT pg_visible_in_snapshot(
            (SELECT c.last_value FROM shardq_map_change_xid c)::text::xid8,
            pg_current_snapshot()) THEN
        RAISE EXCEPTION 'the shard map changed after this transaction''s snapshot was taken; '
            'nothing was written'
            USING ERRCODE = '40001',
                  HINT = 'run the transaction again';
    END IF;
END $$;
