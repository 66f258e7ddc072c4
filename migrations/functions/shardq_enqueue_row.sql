-- shardq_enqueue_row: the checks and the write behind shardq_enqueue and
-- shardq_enqueue_many (p_at prefixes every message, e.g. 'job 3: '). Not
-- for callers: its arguments are shardq_enqueue's.
--
-- The checks are the Rust client's (src/job.rs, NewJob::validate), with
-- its limits: queue and handler 1..255 bytes, ordering key, group and
-- deduplication id at most 1024 bytes, a key with neither of the others, max_attempts 1..1000, the
-- payload (as jsonb text) at most `shardq.max_payload_bytes` (default
-- 1 MiB, the default of limits.max_payload_bytes). A job without
-- max_attempts gets `shardq.default_max_attempts` (default 20, as
-- limits.default_max_attempts). Set those two per database
-- (`ALTER DATABASE ... SET shardq.max_payload_bytes = ...`) to match a
-- shards.toml with other [limits]: database settings reach pooled
-- connections too. NUL characters need no check: PostgreSQL text and jsonb
-- refuse them before this runs. Invalid input: SQLSTATE 22023, the message
-- saying what to change.
--
-- The routing key (ordering key, else group, else deduplication id: a
-- group's jobs share a shard, so its limits and turns are counted there;
-- its deduplication ids are then checked on the group's shard) must route to this
-- shard by the current epoch of the map it records (shardq_route); else
-- SQLSTATE SQ001 before anything is written, the message naming the right
-- shard index, so a caller with a stale or wrong shard list never writes a
-- job where workers and clients would not look for it. A job with neither
-- gets a random shard key among those this shard holds. p_epoch, when not
-- NULL, is the epoch the caller routed by: another than the current one is
-- refused first (SQLSTATE SQ004, shardq_check_route, which also holds the
-- map's lock shared until the transaction ends).
--
-- The row is the one the Rust client writes (src/store/sql/jobs/insert.rs):
-- 'scheduled' with a future run_at, else 'queued' with NOTIFY shardq_ready
-- (the queue's name, sent at commit) to wake listening workers; the id from
-- the table's identity, so ids ascend in call order (per-key order). No key
-- lock is taken, as in the client: claims order a key's jobs by id.
--
-- Between its statements (the map read, the insert, the holder lookup of a
-- deduplicated job) other transactions may write:
-- - the map: `shardq migrate` writes epoch 1 only where none is recorded
--   (which this function refuses); a writer of a later epoch takes the
--   map's lock exclusive, which shardq_check_route holds shared from the
--   first statement to the end of the transaction: the epoch and ranges
--   read here stay current until this job commits.
-- - jobs with the same deduplication id: the insert skips (ON CONFLICT
--   waits for an uncommitted holder and skips when it commits); a holder
--   that finishes before the lookup finds nothing, so the insert is tried
--   again, at most DEDUP_TRIES times (then SQLSTATE SQ003: try again). Each
--   statement reads a fresh snapshot (READ COMMITTED); in a REPEATABLE READ
--   transaction a holder committed after it began fails the insert with
--   40001, which the caller retries as any serialization failure.
CREATE OR REPLACE FUNCTION shardq_enqueue_row(p_at text, p_queue text, p_handler text,
    p_payload jsonb, p_ordering_key text, p_dedup_id text, p_run_at timestamptz,
    p_priority int, p_max_attempts int, p_epoch int, p_group text)
RETURNS TABLE (job_id text, shard_key int, id bigint, is_new boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    -- The Rust client's limits (src/job.rs).
    max_name_bytes constant int := 255;
    max_key_bytes constant int := 1024;
    max_attempts_limit constant int := 1000;
    -- limits.max_payload_bytes and limits.default_max_attempts by default.
    default_payload_bytes constant int := 1048576;
    default_attempts constant int := 20;
    -- Tries of a deduplicated insert while holders of its id finish (as
    -- DEDUP_RACE_RETRIES in src/client/enqueue_once.rs).
    dedup_tries constant int := 3;
    payload jsonb := COALESCE(p_payload, '{}'::jsonb);
    max_payload int := COALESCE(NULLIF(current_setting('shardq.max_payload_bytes', true), '')::int,
                                default_payload_bytes);
    attempts int := COALESCE(p_max_attempts,
        NULLIF(current_setting('shardq.default_max_attempts', true), '')::int, default_attempts);
    routing text := COALESCE(p_ordering_key, p_group, p_dedup_id);
    size int;
    map_epoch int;
    map_count int;
    map_index int;
    k int;
    k_index int;
    keys_held int;
    run_at timestamptz := GREATEST(COALESCE(p_run_at, now()), now());
    status text;
    new_id bigint;
BEGIN
    IF p_queue IS NULL OR p_queue = '' THEN
        RAISE EXCEPTION '%queue name is empty', p_at USING ERRCODE = '22023',
            HINT = 'give the job the queue its workers take';
    END IF;
    IF p_handler IS NULL OR p_handler = '' THEN
        RAISE EXCEPTION '%handler name is empty', p_at USING ERRCODE = '22023',
            HINT = 'give the job the name of a handler registered on the workers';
    END IF;
    FOR i IN 1..5 LOOP
        size := octet_length(CASE i WHEN 1 THEN p_queue WHEN 2 THEN p_handler
                                    WHEN 3 THEN p_ordering_key WHEN 4 THEN p_dedup_id
                                    ELSE p_group END);
        IF size > (CASE WHEN i <= 2 THEN max_name_bytes ELSE max_key_bytes END) THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
                '%s%s is %s bytes, over the limit of %s bytes; shorten it (a long key or id can be hashed)',
                p_at, (ARRAY['queue', 'handler', 'ordering key', 'deduplication id', 'group'])[i], size,
                CASE WHEN i <= 2 THEN max_name_bytes ELSE max_key_bytes END);
        END IF;
    END LOOP;
    size := octet_length(payload::text);
    IF size > max_payload THEN
        RAISE EXCEPTION '%payload is % bytes, over limits.max_payload_bytes = %', p_at, size, max_payload
            USING ERRCODE = '22023',
                  HINT = 'send a smaller payload (or a reference to the data), or raise the '
                         'limit with ALTER DATABASE ... SET shardq.max_payload_bytes';
    END IF;
    IF p_ordering_key IS NOT NULL AND p_dedup_id IS NOT NULL THEN
        RAISE EXCEPTION '%a job cannot have both an ordering key and a deduplication id: the ordering key chooses the shard, so the deduplication id could not be checked across all shards; drop one of them', p_at
            USING ERRCODE = '22023';
    END IF;
    IF p_ordering_key IS NOT NULL AND p_group IS NOT NULL THEN
        RAISE EXCEPTION '%a job cannot have both an ordering key and a group: a key already runs its jobs one at a time in order, and both would choose the shard; drop one of them (a group of a key''s jobs is their key)', p_at
            USING ERRCODE = '22023';
    END IF;
    IF p_group = '' THEN
        RAISE EXCEPTION '%group is empty', p_at USING ERRCODE = '22023',
            HINT = 'give a group name, or NULL for none';
    END IF;
    IF attempts < 1 OR attempts > max_attempts_limit THEN
        RAISE EXCEPTION '%max_attempts is %; it must be at least 1 and at most %', p_at, attempts, max_attempts_limit
            USING ERRCODE = '22023';
    END IF;

    -- The epoch first (SQ004 before SQ001), with the map's lock.
    PERFORM shardq_check_route(p_epoch, VARIADIC ARRAY[]::int[]);
    SELECT e.epoch, e.shard_count INTO map_epoch, map_count FROM shardq_map_epochs e
        ORDER BY e.epoch DESC LIMIT 1;
    SELECT m.shard_index INTO map_index FROM shardq_shard_map m;
    IF routing IS NULL THEN
        -- A uniformly random key among this shard's ranges: the pick-th of
        -- its keys, counting range by range.
        SELECT sum(r.end_key - r.first_key) INTO keys_held FROM shardq_map_ranges r
            WHERE r.epoch = map_epoch AND r.shard_index = map_index;
        IF keys_held IS NULL THEN
            RAISE EXCEPTION '%this shard holds no shard keys at map epoch %; enqueue on another shard',
                p_at, map_epoch USING ERRCODE = 'SQ001', DETAIL = format('epoch=%s', map_epoch);
        END IF;
        SELECT t.first_key + (t.pick - t.before)::int INTO k FROM (
            SELECT r.first_key, r.end_key, p.pick,
                   sum(r.end_key - r.first_key) OVER (ORDER BY r.first_key)
                       - (r.end_key - r.first_key) AS before
            FROM shardq_map_ranges r, (SELECT floor(random() * keys_held)::int AS pick) p
            WHERE r.epoch = map_epoch AND r.shard_index = map_index) t
        WHERE t.pick >= t.before AND t.pick < t.before + (t.end_key - t.first_key);
    ELSE
        k := shardq_shard_key(routing);
        SELECT r.shard_index INTO k_index FROM shardq_map_ranges r
            WHERE r.epoch = map_epoch AND r.first_key <= k AND k < r.end_key;
        IF k_index IS DISTINCT FROM map_index THEN
            RAISE EXCEPTION '%the job''s % routes to shard_key %, which is on shard % of %, not on this shard (%); nothing was written',
                p_at, CASE WHEN p_ordering_key IS NOT NULL THEN 'ordering key'
                           WHEN p_group IS NOT NULL THEN 'group' ELSE 'deduplication id' END,
                k, k_index, map_count, map_index
                USING ERRCODE = 'SQ001',
                      DETAIL = format('shard_key=%s shard_index=%s shard_count=%s epoch=%s',
                                      k, k_index, map_count, map_epoch),
                      HINT = format('enqueue it on shard %s (shardq_route names a key''s shard); '
                                    'this call wrote nothing, so sending it there writes it once',
                                    k_index);
        END IF;
    END IF;

    status := CASE WHEN run_at > now() THEN 'scheduled' ELSE 'queued' END;
    IF p_dedup_id IS NULL THEN
        INSERT INTO workflow_status AS w
            (shard_key, queue, handler, ordering_key, priority, payload, status, run_at, max_attempts,
             job_group)
        VALUES (k, p_queue, p_handler, p_ordering_key, COALESCE(p_priority, 0), payload, status,
                run_at, attempts, p_group)
        RETURNING w.id INTO new_id;
    ELSE
        FOR attempt IN 1..dedup_tries LOOP
            INSERT INTO workflow_status AS w
                (shard_key, queue, handler, ordering_key, priority, payload, status, run_at,
                 max_attempts, dedup_id, job_group)
            VALUES (k, p_queue, p_handler, NULL, COALESCE(p_priority, 0), payload, status,
                    run_at, attempts, p_dedup_id, p_group)
            ON CONFLICT DO NOTHING
            RETURNING w.id INTO new_id;
            EXIT WHEN new_id IS NOT NULL;
            RETURN QUERY SELECT w.shard_key || '-' || w.id, w.shard_key, w.id, false
                FROM workflow_status w
                WHERE w.queue = p_queue AND w.dedup_id = p_dedup_id
                  AND w.status IN ('scheduled', 'queued', 'running', 'held');
            IF FOUND THEN
                RETURN;
            END IF;
        END LOOP;
        IF new_id IS NULL THEN
            RAISE EXCEPTION '%deduplication id `%` kept changing hands; try again', p_at, p_dedup_id
                USING ERRCODE = 'SQ003';
        END IF;
    END IF;
    IF status = 'queued' THEN
        PERFORM pg_notify('shardq_ready', p_queue);
    END IF;
    RETURN QUERY SELECT k || '-' || new_id, k, new_id, true;
END $$;
