-- shardq_key_lock: the advisory lock of one (queue, ordering key). The
-- one-bigint lock space does not overlap the (int, int) space of the dequeue
-- and maintenance slots. Used by every statement that changes a keyed job.
CREATE OR REPLACE FUNCTION shardq_key_lock(p_queue text, p_key text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT hashtextextended(p_queue || chr(31) || p_key, 7) $$;
