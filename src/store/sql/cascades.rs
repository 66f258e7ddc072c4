//! Cancel cascades owed (`shardq_cascades_owed`, migration 0040): written
//! by a cancel (`JOB_CANCEL`) and by the deadline pass
//! (`JOB_END_PAST_DEADLINE`) in their own transaction
//! (`shardq_owe_cascades`), run again by the workers' pass until a
//! cascade has reached every child (`shardq_cascades_paid`).
//!
//! Writers that can run between the pass's take and its paid: a retry of
//! the workflow (the pass then pays the debt without a cascade, or its
//! cascade runs for a workflow already put back: see below), a second
//! cancel after such a retry (it writes a greater generation, which this
//! pass's paid leaves), another process's take (it skips the row: its
//! `due_at` was pushed ahead), a take after this one's lease ran out
//! (both cascades run; each cancel is idempotent), and the canceller's
//! own paid, after its cascade reached every child (the row goes; a
//! second paid deletes nothing). A retry between the pass's status read
//! and its cascade lets the cascade cancel children of a workflow put
//! back: the window is one round trip, and only a retry of a cancelled
//! parent with children left running opens it.

/// Takes up to $1 cascades owed whose time has come (the shard's clock),
/// oldest first, and pushes their `due_at` 30 s ahead: this process's
/// lease while it runs them, and when one that fails is tried again. Rows
/// another process is taking are skipped.
pub const CASCADES_OWED_TAKE: &str = "UPDATE shardq_cascades_owed o \
        SET due_at = now() + interval '30 seconds' \
    FROM (SELECT shard_key, id FROM shardq_cascades_owed \
          WHERE due_at <= now() ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED) t \
    WHERE o.shard_key = t.shard_key AND o.id = t.id \
    RETURNING o.shard_key, o.id, o.generation";

/// Drops the cascades owed by the workflows ($1 shard keys, $2 ids) up to
/// the generations ($3) their payer read before its cascade started: a
/// cascade over all their children ran to its end.
pub const CASCADES_OWED_PAID: &str =
    "SELECT shardq_cascades_paid($1::int[], $2::bigint[], $3::bigint[])";

/// Whether workflow ($1 shard key, $2 id) is cancelled or its cancel is
/// asked (running, or held by a move): a debt of one that is not (put
/// back by a retry since) is paid without a cascade.
pub const CASCADE_PARENT_CANCELLED: &str = "SELECT status = 'cancelled' OR cancel_requested \
        AS cancelled \
    FROM workflow_status WHERE shard_key = $1 AND id = $2 \
        AND NOT (status = 'held' AND held_status = 'running')";

/// Which of the started children ($1 shard keys, $2 ids) whose keys route
/// here have no row here while their key's range is being moved, or is
/// not this shard's by its map (this process's map is stale): each runs,
/// or sits, on another shard. A started child with no row here otherwise
/// finished long ago (retention removed it, or it finished on a shard its
/// range left): nothing to cancel.
pub const CASCADE_CHILDREN_AWAY: &str = "SELECT c.shard_key, c.id \
    FROM unnest($1::int[], $2::bigint[]) AS c(shard_key, id) \
    WHERE NOT EXISTS (SELECT 1 FROM workflow_status w \
            WHERE w.shard_key = c.shard_key AND w.id = c.id) \
        AND (NOT shardq_owns_key(c.shard_key) \
            OR EXISTS (SELECT 1 FROM shardq_map_moves v \
                WHERE v.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e) \
                  AND v.state <> 'released' AND v.first_key <= c.shard_key \
                  AND c.shard_key < v.end_key))";

/// The cascades owed on this shard: how many, and how long the oldest has
/// been owed (seconds, the shard's clock; 0 when none). Read per scrape
/// by the exporter (the table holds a row per cancel not yet paid: a few).
pub const CASCADES_OWED_SUMMARY: &str = "SELECT count(*) AS owed, \
        coalesce(extract(epoch FROM now() - min(owed_since)), 0)::float8 AS oldest_s \
    FROM shardq_cascades_owed";
