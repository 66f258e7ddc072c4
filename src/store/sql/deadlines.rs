//! Workflow deadlines (`NewJob::timeout`, migrations/0036_deadlines.sql):
//! the pass that ends the workflows past theirs. It runs in one
//! transaction, gated by its upkeep lock (`UPKEEP_GATE_AT`): find, try the
//! key locks (`KEYS_TRY_LOCK`), end, release the keys (`KEYS_PROMOTE`).
//!
//! Writers that can run between its statements, on the rows it found:
//! none, they are locked (`FOR UPDATE`) by the find; a completion, a
//! claim, a promotion, a cancel or a recovery of one of them waits for
//! this transaction, then finds it ended (fenced, or nothing left to do)
//! or with its cancellation asked, which each of them handles already. A
//! row locked by such a writer when the find runs is skipped (`SKIP
//! LOCKED`) and ended by the next pass, unless that writer finished it
//! first: a completion that commits first stays (a success is final).
//! Writers of the keys it did not get a lock for (a frozen worker's
//! transaction, say): their jobs are left as they are for a later pass,
//! so one stuck key never stops the pass. Enqueues add rows, which this
//! pass does not look at.

/// Whether any unfinished job on this shard is past its deadline: one
/// probe of `workflow_status_deadline`, a read (no transaction id, no
/// lock), so a pass with nothing to end costs one round trip.
pub const JOB_ANY_PAST_DEADLINE: &str = "SELECT EXISTS (SELECT 1 FROM workflow_status \
    WHERE deadline_at <= now() AND deadline_at IS NOT NULL AND NOT cancel_requested \
        AND status IN ('waiting', 'scheduled', 'queued', 'running')) AS any";

/// Up to $1 unfinished jobs whose deadline passed by the shard's clock and
/// whose cancellation is not asked yet, earliest deadline first, locked:
/// the first entries of the partial index `workflow_status_deadline`. A
/// row locked now (being completed, claimed, promoted) is skipped: the
/// pass never waits on a row, since it tries key locks next.
pub const JOB_FIND_PAST_DEADLINE: &str = "SELECT shard_key, id FROM workflow_status \
    WHERE deadline_at <= now() AND deadline_at IS NOT NULL AND NOT cancel_requested \
        AND status IN ('waiting', 'scheduled', 'queued', 'running') \
    ORDER BY deadline_at LIMIT $1 FOR UPDATE SKIP LOCKED";

/// Ends the jobs among ($1 shard keys, $2 ids) past their deadline, as
/// `JOB_CANCEL` does one job: a waiting, scheduled (delayed, retrying,
/// parked) or queued one is `cancelled` now; a running one gets its
/// cancellation asked (its worker's leaser tells the handler, and its
/// completion writes it `cancelled` unless it succeeded first). Each gets
/// the error saying its deadline passed and when; a running one's is kept
/// by its completion (`shardq_complete_many`). Re-checks the deadline and
/// the status on each row's latest version. Run between `KEYS_TRY_LOCK`
/// and `KEYS_PROMOTE`: ending a job of a key can free that key. Returns
/// the jobs changed and their new status. Writes the cascade each one's
/// children are owed, as `JOB_CANCEL` does (`owed`: the greatest
/// generation written, the same on every row).
pub const JOB_END_PAST_DEADLINE: &str = "WITH ended AS (UPDATE workflow_status w SET \
        status = CASE WHEN w.status = 'running' THEN 'running' ELSE 'cancelled' END, \
        cancel_requested = w.status = 'running', \
        finished_at = CASE WHEN w.status = 'running' THEN NULL ELSE now() END, \
        parked = false, \
        error = 'deadline passed at ' \
            || to_char(w.deadline_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') \
            || ' (NewJob::timeout)' \
    FROM unnest($1::int[], $2::bigint[]) AS e(shard_key, id) \
    WHERE w.shard_key = e.shard_key AND w.id = e.id \
        AND w.deadline_at <= now() AND NOT w.cancel_requested \
        AND w.status IN ('waiting', 'scheduled', 'queued', 'running') \
    RETURNING w.shard_key, w.id, w.status), \
    owed AS (SELECT shardq_owe_cascades(array_agg(e.shard_key), array_agg(e.id)) AS generation \
        FROM ended e) \
    SELECT e.shard_key, e.id, e.status, owed.generation AS owed FROM ended e, owed";
