//! Cancel cascades owed (`shardq_cascades_owed`, migration 0040): written
//! by a cancel (`JOB_CANCEL`) and by the deadline pass
//! (`JOB_END_PAST_DEADLINE`) in their own transaction
//! (`shardq_owe_cascades`), run again by the workers' pass until a
//! cascade has reached every child (`shardq_cascades_paid`).
//!
//! Writers that can run between the pass's take and its paid: a second
//! cancel of the same workflow (its insert finds the row and writes
//! nothing; the cascade running covers it, since a cancelled workflow
//! starts no child), another process's take (it skips the row: its
//! `due_at` was pushed ahead), a take after this one's lease ran out
//! (both cascades run; each cancel is idempotent), and the canceller's
//! own paid, after its cascade reached every child (the row goes; a
//! second paid deletes nothing).

/// Takes up to $1 cascades owed whose time has come (the shard's clock),
/// oldest first, and pushes their `due_at` a minute ahead: this process's
/// lease while it runs them. Rows another process is taking are skipped.
pub const CASCADES_OWED_TAKE: &str = "UPDATE shardq_cascades_owed o \
        SET due_at = now() + interval '60 seconds' \
    FROM (SELECT shard_key, id FROM shardq_cascades_owed \
          WHERE due_at <= now() ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED) t \
    WHERE o.shard_key = t.shard_key AND o.id = t.id \
    RETURNING o.shard_key, o.id";

/// Drops the cascades owed by the workflows ($1 shard keys, $2 ids): a
/// cascade over all their children ran to its end.
pub const CASCADES_OWED_PAID: &str = "SELECT shardq_cascades_paid($1::int[], $2::bigint[])";
