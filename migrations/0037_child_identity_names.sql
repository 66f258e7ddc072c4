-- A child started on another shard records its queue and handler with its
-- identity (shardq_child_intent gains two parameters): the cancel cascade
-- writes a cancelled stand-in under that identity when the parent is
-- cancelled before the child's row is there, so that a later insert of the
-- child writes nothing (src/store/cancel_cascade.rs). The old signature
-- goes; the new text commits with this migration.
DROP FUNCTION IF EXISTS shardq_child_intent(int, bigint, text, bigint, text, int, bigint);
