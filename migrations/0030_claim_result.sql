-- One row type for what a claim returns (shardq_claimed): the claim, each
-- of its paths (keyed, grouped) and the take they share
-- (migrations/functions/shardq_take.sql) return it, instead of one copy of
-- its eleven columns per function. A function's result type cannot change
-- in place, so the claim functions are dropped here and made again with
-- the type when the functions are applied, in this migration's transaction
-- (callers never find neither). The ready probe gains arguments (which
-- kinds, and the rows a claim is taking), a new signature: the old one goes.
CREATE TYPE shardq_claimed AS (
    got_slot int, shard_key int, id bigint, handler text, ordering_key text,
    priority int, payload jsonb, attempts int, fence bigint, queue text,
    created_at timestamptz
);

DROP FUNCTION IF EXISTS shardq_claim(int, int, text, int, text, bigint);
DROP FUNCTION IF EXISTS shardq_claim_keyed(text, int, text, bigint);
DROP FUNCTION IF EXISTS shardq_claim_grouped(text, int, text, bigint);
DROP FUNCTION IF EXISTS shardq_queue_has_ready(text);
