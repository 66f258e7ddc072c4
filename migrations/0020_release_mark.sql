-- The transaction id of the last range release on this shard (`shardq
-- reshard`), kept in a sequence because a sequence is not transactional:
-- the hold trigger (migrations/functions/shardq_hold_moving.sql) reads the
-- latest value whatever its snapshot, and so can tell a REPEATABLE READ or
-- SERIALIZABLE transaction whose snapshot was taken before a release (it
-- would read the range as still moving and write the job held for good)
-- and refuse it with 40001 instead, to be run again.
CREATE SEQUENCE shardq_map_release_xid MINVALUE 0 START 0;
-- The trigger runs with the inserting role's rights: every role that
-- enqueues must read it (as the map tables, GRANT … TO PUBLIC).
GRANT SELECT ON SEQUENCE shardq_map_release_xid TO PUBLIC;
