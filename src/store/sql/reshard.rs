//! Moving ranges of shard keys between shards (`shardq reshard`,
//! src/reshard/). $1 and $2 are always a range's first and end key.

/// Whether the shard holds any job at all (a shard new to the list must
/// not: it takes the map's history as it is).
pub const RESHARD_HAS_JOBS: &str = "SELECT EXISTS (SELECT 1 FROM workflow_status) AS any";

/// The identity sequence's last value (ids given are at most this).
pub const RESHARD_LAST_ID: &str = "SELECT last_value FROM workflow_status_id_seq";

/// Raises the identity sequence to at least $1, so every id this shard
/// gives from now on is above every id the old shards gave a moving range
/// (per key, the copied jobs keep their lower ids and run first).
pub const RESHARD_RAISE_IDS: &str = "SELECT setval('workflow_status_id_seq', \
    greatest((SELECT last_value FROM workflow_status_id_seq), $1::bigint))";

/// Installs the trigger that writes jobs of ranges moving in `held`
/// (migrations/functions/shardq_hold_moving.sql). Its own transaction,
/// before the map's lock: the table lock it takes waits for enqueues in
/// flight, which may hold the map's lock shared.
/// Under a short `lock_timeout`: the table lock must not queue the fleet's
/// statements behind a long transaction (tried again later instead).
pub const RESHARD_TRIGGER_ON: &str =
    "SET lock_timeout = '1s'; CREATE OR REPLACE TRIGGER shardq_hold_moving \
    BEFORE INSERT ON workflow_status FOR EACH ROW EXECUTE FUNCTION shardq_hold_moving(); \
    RESET lock_timeout";

/// Removes the trigger once no range moves in (a short `lock_timeout`, as
/// [`RESHARD_TRIGGER_ON`]).
pub const RESHARD_TRIGGER_OFF: &str = "SET lock_timeout = '1s'; \
    DROP TRIGGER IF EXISTS shardq_hold_moving ON workflow_status; RESET lock_timeout";

/// Takes the map's lock exclusive for the transaction (every enqueue's
/// epoch check, the hold trigger and a schedule's tick take it shared).
/// Bounded by the session's `lock_timeout` (`database.lock_timeout_ms`): a
/// waiting exclusive request queues later shared ones behind it, so a
/// caller's enqueue transaction left open must not stall the shard's
/// enqueues; the step fails (55P03) and the command tries it again.
pub const RESHARD_MAP_LOCK: &str = "SELECT pg_advisory_xact_lock($1::int, $2::int)";

/// The move lock, for the session: enqueues of a `closed` range wait on it.
pub const RESHARD_MOVE_LOCK: &str = "SELECT pg_advisory_lock($1::int, $2::int)";
/// Gives the move lock back.
pub const RESHARD_MOVE_UNLOCK: &str = "SELECT pg_advisory_unlock($1::int, $2::int)";

/// Whether the map tables exist (a shard new to the list may not be
/// migrated yet).
pub const RESHARD_MAP_TABLES: &str =
    "SELECT to_regclass('shardq_map_moves') IS NOT NULL AS present";

/// Every epoch recorded, by epoch.
pub const RESHARD_EPOCHS: &str = "SELECT epoch, shard_count FROM shardq_map_epochs ORDER BY epoch";
/// The moves of epoch $1, by first key.
pub const RESHARD_MOVES_OF: &str = "SELECT first_key, end_key, from_index, to_index, state \
    FROM shardq_map_moves WHERE epoch = $1 ORDER BY first_key";

/// Forgets this shard's map (a shard new to the list, holding no job,
/// before it takes the others' history).
pub const RESHARD_MAP_FORGET: &str = "DELETE FROM shardq_map_moves; \
    DELETE FROM shardq_map_ranges; DELETE FROM shardq_map_epochs";

/// Records epoch $1 over $2 shards.
pub const RESHARD_EPOCH_RECORD: &str =
    "INSERT INTO shardq_map_epochs (epoch, shard_count) VALUES ($1, $2)";
/// Records the ranges of epoch $1: first keys $2, end keys $3, shards $4.
pub const RESHARD_RANGES_RECORD: &str = "INSERT INTO shardq_map_ranges \
    (epoch, first_key, end_key, shard_index) \
    SELECT $1, f, e, s FROM unnest($2::int[], $3::int[], $4::int[]) AS t(f, e, s)";
/// Records the moves of epoch $1: first keys $2, end keys $3, from $4, to
/// $5, states $6, the new shards' first id $7.
pub const RESHARD_MOVES_RECORD: &str = "INSERT INTO shardq_map_moves \
    (epoch, first_key, end_key, from_index, to_index, state, ids_from) \
    SELECT $1, f, e, a, b, s, $7 FROM unnest($2::int[], $3::int[], $4::int[], $5::int[], \
        $6::text[]) AS t(f, e, a, b, s)";
/// Records the new list's size as this shard's count.
pub const RESHARD_PLACE_COUNT: &str = "UPDATE shardq_shard_map SET shard_count = $1";

/// Sets the state of the move of epoch $2 that starts at $1 (to $3).
pub const RESHARD_MOVE_STATE: &str =
    "UPDATE shardq_map_moves SET state = $3 WHERE epoch = $2 AND first_key = $1";

/// The shard keys of the range that hold a job to move: all of them, or
/// ($3) only those with a deduplicated job or a debounced job's pending run
/// (a key's jobs move together). Those are copied before the range lets
/// enqueues in, so an enqueue on the new shard meets the id or the pending
/// run there (an enqueue of a debounced key joins the held copy instead of
/// adding a second run).
pub const RESHARD_KEYS_TO_MOVE: &str = "SELECT shard_key, count(*) AS n FROM workflow_status \
    WHERE shard_key >= $1 AND shard_key < $2 \
      AND status IN ('waiting', 'scheduled', 'queued', 'held') \
      AND (NOT $3::bool OR shard_key IN ( \
          SELECT d.shard_key FROM workflow_status d \
          WHERE d.shard_key >= $1 AND d.shard_key < $2 \
            AND ((d.dedup_id IS NOT NULL \
                  AND d.status IN ('waiting', 'scheduled', 'queued', 'running', 'held')) \
              OR (d.debounce_until IS NOT NULL AND d.status IN ('scheduled', 'held'))))) \
    GROUP BY shard_key ORDER BY shard_key";

/// Marks the unclaimed jobs of shard keys $1..$2 `held` on the old shard
/// (no worker claims them there any more), in one statement: a key's jobs
/// are marked together, so a claim never takes a later job of a key whose
/// earlier one has left. A key with a running job is left for a later
/// pass: a claimed run whose first job fails puts the rest of the run back
/// (`scheduled` first job, later ones running then queued), and moving the
/// failed one alone would let the later ones run first on the old shard. A
/// claim that commits while this runs takes a key's earliest jobs, which
/// then finish on the old shard before the range is released.
pub const RESHARD_MARK: &str = "UPDATE workflow_status w \
    SET held_status = w.status, status = 'held' \
    WHERE w.shard_key >= $1 AND w.shard_key < $2 \
      AND w.status IN ('waiting', 'scheduled', 'queued') \
      AND (w.ordering_key IS NULL OR NOT EXISTS ( \
          SELECT 1 FROM workflow_status r \
          WHERE r.queue = w.queue AND r.ordering_key = w.ordering_key \
            AND r.status = 'running' AND hashtext(r.ordering_key) IS NOT NULL))";

/// The held jobs of shard keys $1..$2 with ids above $3, at most $4 of them
/// by id, as one JSON array, with their steps (another), their messages
/// (a third, in `seq` order) and their events (a fourth): a key with more
/// jobs than a chunk is copied in pieces, each statement bounded. No
/// message is written to a held job (a send refuses it) or received by one
/// (it does not run), and none sets an event (a set_event needs the
/// running claim's fence), so the messages and events read are all it has
/// until it is removed.
pub const RESHARD_HELD_READ: &str = "WITH j AS MATERIALIZED ( \
        SELECT w.* FROM workflow_status w \
        WHERE w.shard_key >= $1 AND w.shard_key < $2 AND w.status = 'held' AND w.id > $3 \
        ORDER BY w.id LIMIT $4) \
    SELECT coalesce((SELECT jsonb_agg(to_jsonb(j) ORDER BY j.id) FROM j), '[]') AS jobs, \
    coalesce((SELECT jsonb_agg(to_jsonb(s)) FROM workflow_steps s JOIN j \
        ON j.shard_key = s.shard_key AND j.id = s.workflow_id), '[]') AS steps, \
    coalesce((SELECT jsonb_agg(to_jsonb(m) ORDER BY m.seq) FROM workflow_messages m JOIN j \
        ON j.shard_key = m.shard_key AND j.id = m.workflow_id), '[]') AS messages, \
    coalesce((SELECT jsonb_agg(to_jsonb(e)) FROM workflow_events e JOIN j \
        ON j.shard_key = e.shard_key AND j.id = e.workflow_id), '[]') AS events";

/// Stand-ins for the deduplicated jobs of shard keys $1..$2 that hold their
/// deduplication id on the old shard and were not copied: running ones, and
/// unclaimed ones the marks did not take (a key with a running job, or a
/// job that went from running back to `scheduled` or `queued` after the
/// keys to move were read). `held` with held_status `running`, no owner;
/// they keep the deduplication id taken on the new shard until the job is
/// copied over them or the range is released. One snapshot: every such job
/// is either finished in it, or has a stand-in.
pub const RESHARD_STAND_INS_READ: &str = "SELECT coalesce(jsonb_agg(to_jsonb(w) || \
        jsonb_build_object('status', 'held', 'held_status', 'running', 'owner', NULL, \
                           'lease_expires_at', NULL)), '[]') AS jobs \
    FROM workflow_status w \
    WHERE w.shard_key >= $1 AND w.shard_key < $2 \
      AND w.status IN ('scheduled', 'queued', 'running') \
      AND w.dedup_id IS NOT NULL";

/// On the new shard: the held copies among $1 (a JSON array of jobs) that
/// were asked to cancel since an earlier pass wrote them.
pub const RESHARD_COPY_CANCELLED: &str = "SELECT w.id, w.shard_key FROM workflow_status w \
    JOIN jsonb_populate_recordset(NULL::workflow_status, $1::jsonb) j \
      ON w.shard_key = j.shard_key AND w.id = j.id \
    WHERE w.status = 'held' AND w.cancel_requested";

/// On the new shard: drops the held copies ($1, a JSON array of jobs) that
/// an earlier pass wrote (a stand-in, or a copy whose cancel request
/// changed since), before [`RESHARD_COPY_JOBS`] writes them as they are now.
pub const RESHARD_COPY_REPLACE: &str = "DELETE FROM workflow_status w \
    USING jsonb_populate_recordset(NULL::workflow_status, $1::jsonb) j \
    WHERE w.shard_key = j.shard_key AND w.id = j.id AND w.status = 'held'";

/// On the new shard: writes the jobs ($1, JSON) as they are, ids kept.
pub const RESHARD_COPY_JOBS: &str = "INSERT INTO workflow_status OVERRIDING SYSTEM VALUE \
    SELECT * FROM jsonb_populate_recordset(NULL::workflow_status, $1::jsonb) \
    ON CONFLICT DO NOTHING";

/// On the new shard: writes the steps ($1, JSON) of the jobs copied (of
/// those written: a job refused for its deduplication id stays behind with
/// its steps).
pub const RESHARD_COPY_STEPS: &str = "INSERT INTO workflow_steps \
    SELECT s.* FROM jsonb_populate_recordset(NULL::workflow_steps, $1::jsonb) s \
    WHERE EXISTS (SELECT 1 FROM workflow_status w \
        WHERE w.shard_key = s.shard_key AND w.id = s.workflow_id AND w.status = 'held') \
    ON CONFLICT DO NOTHING";

/// On the new shard: writes the messages ($1, JSON, in the old shard's
/// `seq` order) of the jobs copied, as [`RESHARD_COPY_STEPS`] does their
/// steps. Each gets a `seq` of this shard, taken in the old order: a
/// workflow's messages keep their order, and those sent after the move
/// come after them. A copy written again replaces the earlier one's
/// messages with it (the replaced job's are deleted by cascade).
pub const RESHARD_COPY_MESSAGES: &str = "INSERT INTO workflow_messages \
        (shard_key, workflow_id, topic, message, idempotency_key, received_by_step, created_at) \
    SELECT m.shard_key, m.workflow_id, m.topic, m.message, m.idempotency_key, \
        m.received_by_step, m.created_at \
    FROM jsonb_populate_recordset(NULL::workflow_messages, $1::jsonb) m \
    WHERE EXISTS (SELECT 1 FROM workflow_status w \
        WHERE w.shard_key = m.shard_key AND w.id = m.workflow_id AND w.status = 'held') \
    ORDER BY m.seq \
    ON CONFLICT DO NOTHING";

/// On the new shard: writes the events ($1, JSON) of the jobs copied, as
/// [`RESHARD_COPY_STEPS`] does their steps (a copy written again replaces
/// the earlier one's events with it: deleted by cascade).
pub const RESHARD_COPY_EVENTS: &str = "INSERT INTO workflow_events \
    SELECT e.* FROM jsonb_populate_recordset(NULL::workflow_events, $1::jsonb) e \
    WHERE EXISTS (SELECT 1 FROM workflow_status w \
        WHERE w.shard_key = e.shard_key AND w.id = e.workflow_id AND w.status = 'held') \
    ON CONFLICT DO NOTHING";

/// On the old shard: removes the jobs copied (ids $3, shard keys $4, each
/// with the cancel request it was copied with, $5), steps, messages and
/// events too (cascade). A
/// job cancelled since it was read stays, to be copied again.
pub const RESHARD_DROP_COPIED: &str = "DELETE FROM workflow_status w \
    USING unnest($3::bigint[], $4::int[], $5::bool[]) AS c(id, shard_key, cancel_requested) \
    WHERE w.id = c.id AND w.shard_key = c.shard_key AND w.status = 'held' \
      AND w.cancel_requested = c.cancel_requested \
      AND w.shard_key >= $1 AND w.shard_key < $2";

/// On the old shard: finishes as cancelled the held jobs of shard keys
/// $1..$2 with ids $3 whose cancellation was asked: jobs the new shard
/// refused (another job holds their deduplication id there), which exist
/// nowhere else, so cancelling one lets the move finish.
pub const RESHARD_CANCEL_REFUSED: &str = "UPDATE workflow_status SET \
        status = 'cancelled', finished_at = now(), held_status = NULL \
    WHERE shard_key >= $1 AND shard_key < $2 AND id = ANY($3::bigint[]) \
      AND status = 'held' AND cancel_requested";

/// The unfinished jobs of the range left on the old shard.
pub const RESHARD_LEFT: &str = "SELECT count(*) AS n FROM workflow_status \
    WHERE shard_key >= $1 AND shard_key < $2 \
      AND status IN ('waiting', 'scheduled', 'queued', 'running', 'held')";

/// On the new shard, under the map's lock: drops the stand-ins of jobs
/// that ran on the old shard, releases the held jobs of the range (a
/// cancelled one as cancelled) and returns them, for the key promotion.
pub const RESHARD_RELEASE: &str = "WITH gone AS ( \
        DELETE FROM workflow_status WHERE shard_key >= $1 AND shard_key < $2 \
            AND status = 'held' AND held_status = 'running' RETURNING id) \
    UPDATE workflow_status SET \
        status = CASE WHEN cancel_requested THEN 'cancelled' ELSE held_status END, \
        finished_at = CASE WHEN cancel_requested THEN now() ELSE finished_at END, \
        held_status = NULL \
    WHERE shard_key >= $1 AND shard_key < $2 AND status = 'held' \
      AND held_status <> 'running' \
    RETURNING shard_key, id, \
        CASE WHEN status = 'queued' THEN pg_notify('shardq_ready', queue) END AS woken";

/// Marks this transaction's id as the last change of the map, outside any
/// snapshot (a sequence; migrations/0020_map_change_mark.sql): the epoch
/// check and the hold trigger refuse a transaction whose snapshot predates
/// it. Run in each transaction that records an epoch, opens or releases a
/// range, after the lock that orders it before enqueues.
pub const RESHARD_MAP_CHANGE_MARK: &str =
    "SELECT setval('shardq_map_change_xid', pg_current_xact_id()::text::bigint)";

/// Whether a range still moves in to this shard at the current epoch.
pub const RESHARD_STILL_MOVING_IN: &str = "SELECT EXISTS (SELECT 1 FROM shardq_map_moves m \
    WHERE m.epoch = (SELECT max(epoch) FROM shardq_map_epochs) \
      AND m.to_index = (SELECT shard_index FROM shardq_shard_map) \
      AND m.state <> 'released') AS moving";
