//! Per-shard upkeep: lease recovery, promotion of due jobs, retention. Each
//! statement first tries its own transaction-level advisory lock ($1 class,
//! $2 slot: `store::locks`), so one process at a time does each job on a
//! shard and the others skip it.

/// Takes upkeep lock ($1, $2) for this transaction; `got` is false when
/// another process holds it; `at`: the database's time of the pass.
pub const UPKEEP_GATE_AT: &str =
    "SELECT pg_try_advisory_xact_lock($1::int, $2::int) AS got, now() AS at";

/// Up to $1 running jobs whose lease expired (owner crashed or hung), oldest
/// first, locked. Rows locked now are skipped: their completion (or a lease
/// extension) is being written, and recovery must never wait, since it takes
/// the key locks next and only tries them (so holding these row locks while
/// it does cannot deadlock with a completion that holds a key lock and waits
/// for one of these rows: the try fails, the pass skips that key, commits).
///
/// Only leases that expired at $2 or later (NULL: all): while a long
/// transaction holds the xmin horizon, the lease index keeps an entry for
/// the running version of every job finished since, all expired, and a
/// pass from the start would walk them all, every second.
pub const JOB_FIND_EXPIRED: &str = "SELECT shard_key, id, lease_expires_at FROM workflow_status \
    WHERE status = 'running' AND lease_expires_at < now() \
      AND lease_expires_at >= COALESCE($2::timestamptz, '-infinity') \
    ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED";

/// Takes the recovery's upkeep lock ($1 class, $2 slot) for this
/// transaction, like [`UPKEEP_GATE_AT`], and reads the newest lease floor
/// (`floor_at`, NULL when none was made yet: migration 51). Read in the
/// statement's snapshot, taken before the lock: a move of the floor that
/// committed since only raised it, and an older floor is still true (a
/// lease written after a floor ends after it).
pub const RECOVERY_GATE: &str = "SELECT pg_try_advisory_xact_lock($1::int, $2::int) AS got, \
    now() AS at, (SELECT f.floor_at FROM shardq_lease_floor_moves f \
        ORDER BY f.move_seq DESC LIMIT 1) AS floor_at";

/// Moves the lease floor, in the transaction that took its upkeep lock
/// (`UPKEEP_GATE_AT` with `LEASE_FLOOR_SLOT`, in an earlier statement, so
/// that this one's snapshot sees the last move's row), in one statement
/// (migration 51 says why each step is safe): the newest row's
/// candidate, once every transaction that took its id before the move
/// that noted it has ended and it is $1 ms old, becomes the floor, or the
/// earliest lease still running between the old floor and it, whichever
/// is earlier; a new candidate is noted with it (this transaction's
/// `now()` and id). A shard with no row gets its first candidate (no
/// floor yet). A row is written only then: one every $1 ms or so, and
/// none while an open writer holds the candidate back; the rows before
/// it are deleted. `floor_at`: the floor after it (NULL: none yet).
pub const LEASE_FLOOR_MOVE: &str = "WITH newest AS MATERIALIZED ( \
        SELECT f.move_seq, f.floor_at, f.pending_at, f.pending_xid \
        FROM shardq_lease_floor_moves f ORDER BY f.move_seq DESC LIMIT 1 \
    ), due AS MATERIALIZED ( \
        SELECT n.floor_at, n.pending_at FROM newest n \
        WHERE n.pending_at <= now() - $1::bigint * interval '1 millisecond' \
          AND pg_snapshot_xmin(pg_current_snapshot()) > n.pending_xid \
    ), promoted AS MATERIALIZED ( \
        SELECT least(d.pending_at, (SELECT min(w.lease_expires_at) FROM workflow_status w \
            WHERE w.status = 'running' AND w.lease_expires_at < d.pending_at \
              AND w.lease_expires_at >= coalesce(d.floor_at, '-infinity'))) AS floor_at \
        FROM due d \
    ), moved AS ( \
        INSERT INTO shardq_lease_floor_moves (move_seq, floor_at, pending_at, pending_xid) \
        SELECT coalesce((SELECT move_seq FROM newest), 0) + 1, \
            (SELECT floor_at FROM promoted), now(), pg_current_xact_id() \
        WHERE EXISTS (SELECT FROM promoted) OR NOT EXISTS (SELECT FROM newest) \
        RETURNING move_seq, floor_at \
    ), replaced AS ( \
        DELETE FROM shardq_lease_floor_moves f WHERE f.move_seq < (SELECT move_seq FROM moved) \
    ) \
    SELECT coalesce((SELECT floor_at FROM moved), (SELECT floor_at FROM newest)) AS floor_at";

/// Tries the key locks of the jobs among ($1 shard keys, $2 ids), at most $3
/// distinct keys, and returns the jobs it may change now: the unkeyed ones
/// and those whose key lock it got (`try_key_locks!` in macros.rs). Run first in the
/// transaction that changes the jobs, so that the statements after it see
/// every change made under those locks.
pub const KEYS_TRY_LOCK: &str = concat!(
    "WITH jobs AS MATERIALIZED ( \
        SELECT w.shard_key, w.id, w.queue, w.ordering_key \
        FROM unnest($1::int[], $2::bigint[]) AS j(shard_key, id) \
        JOIN workflow_status w ON w.shard_key = j.shard_key AND w.id = j.id \
    ), ",
    try_key_locks!("jobs", "$3"),
    " SELECT shard_key, id FROM free"
);

/// Returns the expired jobs among ($1, $2) to the queue (`return_lost!` in macros.rs),
/// re-checking the expiry on each row's latest version.
pub const JOB_RECOVER_EXPIRED: &str = return_lost!(
    "'lease expired on attempt ' || w.attempts || ' of ' || w.max_attempts \
        || ' (the worker crashed or hung)'",
    "w.lease_expires_at < now()"
);

/// Makes up to $3 scheduled jobs whose time has come ready, when it gets
/// upkeep lock ($1, $2). A keyed job is made ready only under its key's
/// lock, tried (at most $4 distinct keys): a key whose lock is held now is
/// promoted by a later pass.
///
/// Why the key lock: `shardq_claim_keyed` (migrations/functions/) decides in one
/// statement, under the key lock, that a key is busy (a job of it running
/// or scheduled) and parks the key's queued jobs as `waiting` in a later
/// one. A promotion that queued the key's scheduled job in between was
/// parked with them, and the key was left with `waiting` jobs only: nothing
/// ever queued it again (tests/promotion_race.rs). With the lock tried here,
/// the two exclude each other: a claim that holds the key makes this pass
/// skip it; a promotion that holds it makes the claim leave the key's head
/// for a later claim, whose statements, run after the promotion committed,
/// see the job queued. Writers that still take no key lock between the
/// claim's statements: enqueue, which only adds a `queued` job (parked
/// behind the busy key, or met by the next claim) or a `scheduled` one (it
/// makes a key busier, never frees it); and this statement itself for
/// unkeyed jobs, which have no key to strand. A job locked by this
/// statement (`FOR UPDATE`) while it tries the key lock cannot deadlock:
/// the try never waits.
///
/// A debounced job's pending run leaves its key's index here
/// (`debounce_until` cleared): an enqueue of the key waits for this
/// statement on the row, then writes the key's next run
/// (`JOB_INSERT_DEBOUNCED`). A non-debounced job's `debounce_until` is
/// NULL already: nothing changes for it.
pub const JOB_PROMOTE_DUE: &str = concat!(
    "WITH gate AS MATERIALIZED ( \
        SELECT pg_try_advisory_xact_lock($1::int, $2::int) AS got \
    ), due AS MATERIALIZED ( \
        SELECT shard_key, id, queue, ordering_key FROM workflow_status \
        WHERE status = 'scheduled' AND run_at <= now() AND (SELECT got FROM gate) \
        ORDER BY run_at LIMIT $3 FOR UPDATE SKIP LOCKED \
    ), ",
    try_key_locks!("due", "$4"),
    " UPDATE workflow_status w SET status = 'queued', debounce_until = NULL \
    FROM free WHERE w.shard_key = free.shard_key AND w.id = free.id \
    RETURNING pg_notify('shardq_ready', w.queue)"
);

/// How long until the earliest scheduled job is due, or the earliest
/// deadline passes (`JOB_FIND_PAST_DEADLINE`'s rows), in ms by the shard's
/// clock (negative: due already); NULL when neither is there. One probe of
/// the scheduled index's first entry and one of the deadline index's. A
/// parent's wake left to the promotion (a child flagged `parent_wake`: one
/// probe of an index that is almost always empty) is due now.
pub const JOB_NEXT_DUE: &str = "SELECT CASE WHEN EXISTS (SELECT 1 FROM workflow_status \
            WHERE parent_wake) THEN 0::bigint \
        ELSE (extract(epoch FROM least( \
            (SELECT min(run_at) FROM workflow_status WHERE status = 'scheduled'), \
            (SELECT min(deadline_at) FROM workflow_status \
                WHERE deadline_at IS NOT NULL AND NOT cancel_requested \
                    AND status IN ('waiting', 'scheduled', 'queued', 'running'))) \
            - clock_timestamp()) * 1000)::bigint END AS ms";

/// Deletes up to $4 finished jobs (and, by cascade, their steps) that finished
/// more than $3 ms ago, oldest first, when it gets upkeep lock ($1, $2).
pub const JOB_DELETE_FINISHED: &str = "WITH gate AS MATERIALIZED ( \
        SELECT pg_try_advisory_xact_lock($1::int, $2::int) AS got \
    ), old AS ( \
        SELECT shard_key, id FROM workflow_status \
        WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled') \
            AND finished_at < now() - $3::bigint * interval '1 millisecond' \
            AND (SELECT got FROM gate) \
        ORDER BY finished_at LIMIT $4 FOR UPDATE SKIP LOCKED \
    ) \
    DELETE FROM workflow_status w USING old \
    WHERE w.shard_key = old.shard_key AND w.id = old.id";

/// Deletes up to $1 key floors (`shardq_key_floors`, migration 44) not
/// moved for an hour, among the rows of about $2 percent of the table's
/// pages (a sample: a sweep reads a bounded part of a table with a row per
/// key ever used). A missing row is floor 0, always safe: a key quiet for
/// an hour pays one walk of its history on its next job (a walk of its
/// dead versions too while a transaction has held vacuum back that long).
/// A floor a claim or a completion is writing is skipped, never waited on.
pub const KEY_FLOORS_FORGET_QUIET: &str = "DELETE FROM shardq_key_floors f \
    WHERE f.ctid IN ( \
        SELECT q.ctid FROM shardq_key_floors q TABLESAMPLE SYSTEM ($2::float8) \
        WHERE q.set_at < now() - interval '1 hour' \
        LIMIT $1 FOR UPDATE SKIP LOCKED)";

/// Deletes up to $1 group start-rate buckets that are full again and not
/// taken from for 10 minutes (or whose queue has no group rate now): a
/// missing row is a full bucket to the claim, so each holds only the
/// groups that started jobs lately. A group's live row is its newest (a
/// claim that takes from it adds the next and deletes the one it read,
/// migration 50), met first by the next claim's read however many
/// replaced rows a held horizon keeps, but only while one is live: the
/// read after a bucket was forgotten walks every row of the group the
/// hold kept. So a group busy a moment ago keeps its row even when full,
/// and that walk comes at most once per 10 minutes of a group's rest. A
/// bucket a claim is deleting is skipped, never waited on (a claim may be
/// waiting on another bucket this statement holds); one a claim read and
/// this deletes first is gone when the claim's delete comes, its new row
/// carrying the bucket on, unseen by this statement.
pub const GROUP_BUCKETS_FORGET_FULL: &str = "DELETE FROM shardq_group_buckets b \
    WHERE b.ctid IN ( \
        SELECT t.ctid FROM shardq_group_buckets t \
        LEFT JOIN shardq_queue_limits l ON l.queue = t.queue \
        WHERE l.group_rate_count IS NULL \
           OR (t.tokens_at < clock_timestamp() - interval '10 minutes' \
               AND t.tokens + extract(epoch FROM clock_timestamp() - t.tokens_at) * 1000.0 \
                   * l.group_rate_count / l.group_rate_period_ms \
                 >= greatest(1.0, l.group_rate_count * 50.0 / l.group_rate_period_ms)) \
        LIMIT $1 FOR UPDATE OF t SKIP LOCKED)";
