-- The transaction id of the last change of the shard map on this shard
-- (`shardq reshard`: an epoch recorded, a range opened or released), kept
-- in a sequence because a sequence is not transactional: the epoch check
-- (migrations/functions/shardq_check_route.sql) and the hold trigger
-- (shardq_hold_moving.sql) read the latest value whatever their snapshot,
-- and so can tell a REPEATABLE READ or SERIALIZABLE transaction whose
-- snapshot was taken before that change (it would read the old map and
-- write the job where the map no longer sends it, or hold it for good),
-- and refuse it with 40001 instead, to be run again.
CREATE SEQUENCE shardq_map_change_xid MINVALUE 0 START 0;
-- Read with the inserting role's rights: every role that enqueues must
-- read it (as the map tables, GRANT … TO PUBLIC).
GRANT SELECT ON SEQUENCE shardq_map_change_xid TO PUBLIC;
