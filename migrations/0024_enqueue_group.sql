-- The SQL enqueue takes a group (a new last argument). The old signatures
-- are dropped here, the newest migration, so the new texts commit in the
-- same transaction and callers never find neither (a fresh shard has no
-- functions yet: they are written after the migrations).
DROP FUNCTION IF EXISTS shardq_enqueue(text, text, jsonb, text, text, timestamptz, int, int, int);
DROP FUNCTION IF EXISTS shardq_enqueue_row(text, text, text, jsonb, text, text, timestamptz, int, int, int);
