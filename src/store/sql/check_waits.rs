//! `shardq check` for workflows that wait: wake-ups lost, children whose
//! parent is gone, children a cancel left behind. Read in the check's one
//! `REPEATABLE READ READ ONLY` snapshot, after [`super::CHECK_SETTINGS`],
//! and shaped as every check statement is (`broken`, `capped`, `scanned`,
//! the parallel `ex_*` arrays; see [`super::CHECK_STRANDED_KEYS`]'s
//! module). Each reads a bounded window of one index, never the whole
//! history: its cost is stated beside it, measured on PostgreSQL 15 on the
//! shared 2-core test machine (other builds running) with 20,000 parked
//! workflows, 30,000 finished rows, 5,000 queued children and 10,000
//! unreceived messages (`EXPLAIN ANALYZE` of each at its bound of
//! 10,000; tests/it/check_waits.rs builds that shard); not yet at the
//! millions of rows the job checks were measured with.

/// Lost wake-up of a message: a parked workflow (`scheduled`, `parked`)
/// whose undecided recv (a step `shardq:recv:N:wait`, no step
/// `shardq:recv:N`) waits on a topic that holds an unreceived message
/// sent before the workflow's `run_at`. A send that finds the wait sets
/// `run_at` to its `now()`, which is also the message's `created_at`
/// (migrations/functions/shardq_send_row.sql), and a recv takes a message
/// there before it waits; so a message older than `run_at` is one whose
/// send did not wake it (or whose recv did not take it). A keyed workflow
/// woken while a claim held its key stays `scheduled` with `run_at` equal
/// to the message's time: not older, not reported (its promotion is
/// [`super::CHECK_DUE_NOT_PROMOTED`]'s to judge).
///
/// Walks the first $1 entries of `workflow_messages_unreceived` in index
/// order (one heap fetch each, for `created_at`), grouped per workflow and
/// topic as it goes; per group one primary-key probe of the workflow, and
/// for a parked one whose oldest message is older than its `run_at` a
/// walk of its steps (the workflow's prefix of the steps' primary key).
/// Cost: linear in unreceived messages up to $1 (4-7 µs each: 40-70 ms
/// for 10,000 in 10,000 mailboxes of parked workflows), never in received
/// ones. Unreceived messages of finished workflows (kept until retention
/// deletes them) count against the bound. Examples ($2): each workflow's
/// first broken topic.
pub const CHECK_LOST_MESSAGE_WAKE: &str = "WITH seen AS MATERIALIZED ( \
        SELECT m.shard_key, m.workflow_id, m.topic, m.created_at FROM workflow_messages m \
        WHERE m.received_by_step IS NULL \
        ORDER BY m.shard_key, m.workflow_id, m.topic, m.seq LIMIT $1 \
    ), mailboxes AS ( \
        SELECT shard_key, workflow_id, topic, count(*) AS unreceived, \
            min(created_at) AS oldest \
        FROM seen GROUP BY shard_key, workflow_id, topic \
    ), found AS MATERIALIZED ( \
        SELECT DISTINCT ON (w.id, w.shard_key) w.shard_key, w.id, w.queue, w.ordering_key, \
            b.topic, b.unreceived, b.oldest, w.run_at \
        FROM mailboxes b \
        JOIN workflow_status w ON w.shard_key = b.shard_key AND w.id = b.workflow_id \
        WHERE w.status = 'scheduled' AND w.parked AND b.oldest < w.run_at \
          AND EXISTS (SELECT 1 FROM workflow_steps s \
              WHERE s.shard_key = w.shard_key AND s.workflow_id = w.id \
                AND s.step_name LIKE 'shardq:recv:%:wait' AND s.output->>'topic' = b.topic \
                AND NOT EXISTS (SELECT 1 FROM workflow_steps d \
                    WHERE d.shard_key = w.shard_key AND d.workflow_id = w.id \
                      AND d.step_name = left(s.step_name, -length(':wait')))) \
        ORDER BY w.id, w.shard_key, b.oldest \
    ), shown AS ( \
        SELECT * FROM found ORDER BY id LIMIT $2 \
    ) \
    SELECT (SELECT count(*) FROM found) AS broken, \
        (SELECT count(*) FROM seen) >= $1 AS capped, \
        (SELECT count(*) FROM seen) AS scanned, \
        coalesce(array_agg(shard_key ORDER BY id), '{}') AS ex_shard_key, \
        coalesce(array_agg(id ORDER BY id), '{}') AS ex_id, \
        coalesce(array_agg(queue ORDER BY id), '{}') AS ex_queue, \
        coalesce(array_agg(ordering_key ORDER BY id), '{}') AS ex_key, \
        coalesce(array_agg('parked in a recv on topic ' || topic || ' until ' \
            || to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC with ' \
            || unreceived || ' unreceived message(s), the oldest sent ' \
            || round(extract(epoch FROM now() - oldest)::numeric, 1) \
            || ' s ago: its send did not wake it' ORDER BY id), '{}') AS ex_detail \
    FROM shown";

/// Lost wake-up of a child: a parked parent (`scheduled`, `parked`) whose
/// undecided result step (a step `shardq:child:N:result:wait`, no step
/// `shardq:child:N:result`) waits on a child on this shard that finished
/// (succeeded, failed, dead, cancelled) more than $3 ms ago. The child's
/// final status wakes its parent in the same transaction, or, when the
/// parent's row was locked then, flags the child (`parent_wake`) for the
/// promotion of due jobs, which wakes it within a maintenance interval
/// (`shardq_child_finished`, `shardq_wake_parents`): past the grace the
/// wake was lost (no flag left) or the promotion is not settling it (the
/// flag still set; the detail says which).
///
/// A parent parked on a child has `run_at` at most the re-check ($2 ms)
/// ahead (`CHILD_RESULT_DECIDE` sets it so; a lost wake leaves it there),
/// so the walk is a range of `workflow_status_scheduled`: scheduled rows
/// due after now and no later than now + $2, soonest first, at most $1
/// (one heap fetch each); per parked one a walk of its steps (its prefix
/// of the steps' primary key) and one primary-key probe per child it
/// waits on. Due rows are [`super::CHECK_DUE_NOT_PROMOTED`]'s. Cost:
/// linear in scheduled rows due within the re-check, up to $1 (about
/// 1.3 µs each: 13 ms for 10,000 parked rows with no steps; a parent's
/// steps add their walk). Examples ($4): each parent's
/// child that finished first.
pub const CHECK_LOST_CHILD_WAKE: &str = "WITH seen AS MATERIALIZED ( \
        SELECT w.shard_key, w.id, w.queue, w.ordering_key, w.parked FROM workflow_status w \
        WHERE w.status = 'scheduled' AND w.run_at > now() \
          AND w.run_at <= now() + $2::bigint * interval '1 millisecond' \
        ORDER BY w.run_at LIMIT $1 \
    ), found AS MATERIALIZED ( \
        SELECT DISTINCT ON (p.id, p.shard_key) p.shard_key, p.id, p.queue, p.ordering_key, \
            c.shard_key AS child_key, c.id AS child_id, c.status AS child_status, \
            c.finished_at, c.parent_wake \
        FROM seen p \
        JOIN workflow_steps s ON s.shard_key = p.shard_key AND s.workflow_id = p.id \
        JOIN workflow_status c ON c.shard_key = (s.output->>'child_shard_key')::int \
            AND c.id = (s.output->>'child_id')::bigint \
        WHERE p.parked AND s.step_name LIKE 'shardq:child:%:wait' \
          AND NOT EXISTS (SELECT 1 FROM workflow_steps d \
              WHERE d.shard_key = p.shard_key AND d.workflow_id = p.id \
                AND d.step_name = left(s.step_name, -length(':wait'))) \
          AND c.status IN ('succeeded', 'failed', 'dead', 'cancelled') \
          AND c.finished_at < now() - $3::bigint * interval '1 millisecond' \
        ORDER BY p.id, p.shard_key, c.finished_at \
    ), shown AS ( \
        SELECT * FROM found ORDER BY id LIMIT $4 \
    ) \
    SELECT (SELECT count(*) FROM found) AS broken, \
        (SELECT count(*) FROM seen) >= $1 AS capped, \
        (SELECT count(*) FROM seen) AS scanned, \
        coalesce(array_agg(shard_key ORDER BY id), '{}') AS ex_shard_key, \
        coalesce(array_agg(id ORDER BY id), '{}') AS ex_id, \
        coalesce(array_agg(queue ORDER BY id), '{}') AS ex_queue, \
        coalesce(array_agg(ordering_key ORDER BY id), '{}') AS ex_key, \
        coalesce(array_agg('parked on child ' || child_key || '-' || child_id || ', ' \
            || child_status || ' ' || round(extract(epoch FROM now() - finished_at)::numeric, 1) \
            || ' s ago: ' || CASE WHEN parent_wake \
                THEN 'its wake is left to the promotion (parent_wake), which has not settled it' \
                ELSE 'its wake was lost' END ORDER BY id), '{}') AS ex_detail \
    FROM shown";

/// A child's wake not relayed to its parent on another shard: a child on
/// this shard whose final status flagged its parent's wake
/// (`parent_wake`) more than $2 ms ago, its parent's key not this
/// shard's. The relay (src/worker/wake_relay.rs) delivers such a wake to
/// the parent's shard and clears the flag when the child finishes, or
/// within a maintenance interval: past the grace, the parent's shard does
/// not take the wake (down, frozen, or its parent held by a move), or no
/// worker relays from this shard.
///
/// A parent whose key's range is moving is not judged: its wake waits for
/// the move's release by design (`shardq_wake_parent`), however long the
/// move takes. The map is read as the relay reads it (its ranges joined).
///
/// Walks the first $1 entries of `workflow_status_parent_wakes` in index
/// order (one heap fetch each); per entry past the grace two probes of the
/// map's few rows. Cost: linear in flagged children up to $1, which are
/// few unless wakes are stuck. Examples ($3).
pub const CHECK_WAKE_NOT_RELAYED: &str = "WITH seen AS MATERIALIZED ( \
        SELECT w.shard_key, w.id, w.queue, w.ordering_key, w.parent_shard_key, w.parent_id, \
            w.finished_at FROM workflow_status w WHERE w.parent_wake \
        ORDER BY w.shard_key, w.id LIMIT $1 \
    ), found AS MATERIALIZED ( \
        SELECT s.* FROM seen s \
        WHERE s.finished_at < now() - $2::bigint * interval '1 millisecond' \
          AND NOT EXISTS (SELECT 1 FROM shardq_map_ranges r \
              WHERE r.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e) \
                AND r.shard_index = (SELECT m.shard_index FROM shardq_shard_map m) \
                AND r.first_key <= s.parent_shard_key AND s.parent_shard_key < r.end_key) \
          AND NOT EXISTS (SELECT 1 FROM shardq_map_moves v \
              WHERE v.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e) \
                AND v.state <> 'released' \
                AND v.first_key <= s.parent_shard_key AND s.parent_shard_key < v.end_key) \
    ), shown AS ( \
        SELECT * FROM found ORDER BY id LIMIT $3 \
    ) \
    SELECT (SELECT count(*) FROM found) AS broken, \
        (SELECT count(*) FROM seen) >= $1 AS capped, \
        (SELECT count(*) FROM seen) AS scanned, \
        coalesce(array_agg(shard_key ORDER BY id), '{}') AS ex_shard_key, \
        coalesce(array_agg(id ORDER BY id), '{}') AS ex_id, \
        coalesce(array_agg(queue ORDER BY id), '{}') AS ex_queue, \
        coalesce(array_agg(ordering_key ORDER BY id), '{}') AS ex_key, \
        coalesce(array_agg('finished ' \
            || round(extract(epoch FROM now() - finished_at)::numeric, 1) \
            || ' s ago; its wake to parent ' || parent_shard_key || '-' || parent_id \
            || ' on another shard is not relayed' ORDER BY id), '{}') AS ex_detail \
    FROM shown";

/// The unfinished rows a child check reads, each state by its own index
/// (every running row, from the lease floor; the first $1 of each other
/// unfinished state), with the columns the child checks judge. `held`
/// rows (a move's) are left out. Ready jobs without a group are read from
/// their queue and priority's ready floors, as the claims and the backlog
/// read find them (`workflow_status_ready_plain` and `_ready_keyed`), and
/// grouped ones from their queue's grouped floor (`grouped_queues!`, CTEs
/// the statement starts with) and those without a turn yet, so that a
/// long transaction holding the
/// horizon does not make the windows walk the entry every job claimed
/// since left behind. A ready job below its floor is
/// [`super::CHECK_JOB_STATE`]'s to find: its windows start at each
/// index's start.
macro_rules! unfinished_windows {
    () => {
        concat!(
            "(SELECT 'running' AS scan, shard_key, id, queue, ordering_key, created_at, \
            parent_shard_key, parent_id FROM workflow_status WHERE status = 'running' AND ",
            at_or_past_lease_floor!("lease_expires_at"),
            ") \
        UNION ALL \
        (SELECT 'queued', w.* FROM shardq_ready_floors f CROSS JOIN LATERAL ( \
            SELECT r.shard_key, r.id, r.queue, r.ordering_key, r.created_at, \
                r.parent_shard_key, r.parent_id FROM workflow_status r \
            WHERE r.status = 'queued' AND r.ordering_key IS NULL AND r.job_group IS NULL \
              AND r.queue = f.queue AND r.priority = f.priority \
              AND r.ready_seq >= f.floor_seq \
            ORDER BY r.ready_seq LIMIT $1) w LIMIT $1) \
        UNION ALL \
        (SELECT 'queued_keyed', w.* FROM shardq_ready_floors f CROSS JOIN LATERAL ( \
            SELECT r.shard_key, r.id, r.queue, r.ordering_key, r.created_at, \
                r.parent_shard_key, r.parent_id FROM workflow_status r \
            WHERE r.status = 'queued' AND r.ordering_key IS NOT NULL \
              AND r.queue = f.queue AND r.priority = f.priority \
              AND r.ready_seq >= f.keyed_floor_seq \
            ORDER BY r.ready_seq LIMIT $1) w LIMIT $1) \
        UNION ALL \
        (SELECT 'queued_grouped', w.* FROM grouped_queues q CROSS JOIN LATERAL ( \
            (SELECT r.shard_key, r.id, r.queue, r.ordering_key, r.created_at, \
                r.parent_shard_key, r.parent_id FROM workflow_status r \
            WHERE r.status = 'queued' AND r.job_group IS NOT NULL \
              AND r.queue = q.queue AND r.turn >= q.floor_turn \
            ORDER BY r.turn LIMIT $1) \
            UNION ALL \
            (SELECT r.shard_key, r.id, r.queue, r.ordering_key, r.created_at, \
                r.parent_shard_key, r.parent_id FROM workflow_status r \
            WHERE r.status = 'queued' AND r.job_group IS NOT NULL \
              AND r.queue = q.queue AND r.turn IS NULL LIMIT $1)) w LIMIT $1) \
        UNION ALL \
        (SELECT 'waiting', shard_key, id, queue, ordering_key, created_at, parent_shard_key, \
            parent_id FROM workflow_status \
         WHERE status = 'waiting' AND ordering_key IS NOT NULL \
             AND hashtext(ordering_key) IS NOT NULL \
         ORDER BY queue, ordering_key, status, id LIMIT $1) \
        UNION ALL \
        (SELECT 'scheduled', shard_key, id, queue, ordering_key, created_at, \
            parent_shard_key, parent_id FROM workflow_status \
         WHERE status = 'scheduled' ORDER BY run_at LIMIT $1)"
        )
    };
}

/// A child whose parent is missing: an unfinished child (`parent_id`
/// set) whose parent's row is not on this shard, judged only where the
/// parent must be here:
///
/// - the parent's key is this shard's (a child started from another
///   shard has its parent there);
/// - the child was created less than $2 ms (the retention of finished
///   jobs) ago: its parent was unfinished when it started it (a start is a
///   step of the running parent), so finished no earlier, and retention
///   cannot have deleted it yet;
/// - no range move recorded here covers the child's or the parent's shard
///   key with an `ids_from` above its id: a move copies only unclaimed
///   jobs, so a child can move without its running or finished parent
///   (and a keyed child, whose key is not its parent's, in another range);
///   every job a move's target creates afterwards has an id of at least
///   `ids_from`, and every job created before (anywhere) one below it.
///
/// Children moving now (`held`) are not read. Reads the windows
/// (`unfinished_windows!`: every running row, the first $1 of each other
/// unfinished state by its own index); per child in them one
/// primary-key probe of its parent and a read of the few move rows (the
/// whole small table). Cost: about 1.5 µs per row read (20-25 ms for
/// 15,000 rows, 5,000 of them children, with $1 = 10,000).
/// `capped` says an unfinished state had more rows than $1. Examples
/// ($3): the lowest ids.
pub const CHECK_PARENT_MISSING: &str = concat!(
    "WITH RECURSIVE ",
    grouped_queues!("NULL::text"),
    ", seen AS MATERIALIZED (",
    unfinished_windows!(),
    "), found AS MATERIALIZED ( \
        SELECT v.shard_key, v.id, v.queue, v.ordering_key, v.parent_shard_key, v.parent_id \
        FROM seen v \
        WHERE v.parent_id IS NOT NULL \
          AND v.created_at >= now() - $2::bigint * interval '1 millisecond' \
          AND shardq_owns_key(v.parent_shard_key) \
          AND NOT EXISTS (SELECT 1 FROM shardq_map_moves m \
              WHERE (m.first_key <= v.shard_key AND v.shard_key < m.end_key \
                     AND v.id < m.ids_from) \
                 OR (m.first_key <= v.parent_shard_key AND v.parent_shard_key < m.end_key \
                     AND v.parent_id < m.ids_from)) \
          AND NOT EXISTS (SELECT 1 FROM workflow_status p \
              WHERE p.shard_key = v.parent_shard_key AND p.id = v.parent_id) \
    ), shown AS ( \
        SELECT * FROM found ORDER BY id LIMIT $3 \
    ) \
    SELECT (SELECT count(*) FROM found) AS broken, \
        EXISTS (SELECT 1 FROM seen WHERE scan <> 'running' \
            GROUP BY scan HAVING count(*) >= $1) AS capped, \
        (SELECT count(*) FROM seen) AS scanned, \
        coalesce(array_agg(shard_key ORDER BY id), '{}') AS ex_shard_key, \
        coalesce(array_agg(id ORDER BY id), '{}') AS ex_id, \
        coalesce(array_agg(queue ORDER BY id), '{}') AS ex_queue, \
        coalesce(array_agg(ordering_key ORDER BY id), '{}') AS ex_key, \
        coalesce(array_agg('unfinished child of ' || parent_shard_key || '-' || parent_id \
            || ', which is not on this shard' ORDER BY id), '{}') AS ex_detail \
    FROM shown"
);

/// A cancelled workflow with children left: a workflow cancelled more than
/// $2 ms ago that has unfinished children (waiting, scheduled, queued,
/// running, or held by a move but for a running job's stand-in) whose
/// cancellation was not asked, other than those started with
/// `ChildPolicy::Abandon` (`abandon_on_parent_cancel`), which a cancel
/// leaves running on purpose. The client cancels the children one by one
/// after the parent (`Client::cancel`): a client that stopped midway
/// leaves the rest. A running child whose cancellation was asked is not
/// counted (its handler learns it at its next step).
///
/// The $1 latest of `workflow_status_failed` (dead, failed, cancelled;
/// backward by `finished_at`) that finished before now − $2, one heap
/// fetch each; per cancelled one a probe of `workflow_status_children`
/// (its children, finished ones too). Cancellations older than the window
/// are not judged (`capped` says the window was full). Cost: about 2 µs
/// per row read, children probes included (17-23 ms with $1 = 10,000). Examples ($3): the cancelled workflows of lowest ids, each
/// with its first child left.
pub const CHECK_CANCELLED_CHILDREN_LEFT: &str = "WITH seen AS MATERIALIZED ( \
        SELECT w.shard_key, w.id, w.queue, w.ordering_key, w.status, w.finished_at \
        FROM workflow_status w \
        WHERE w.status IN ('dead', 'failed', 'cancelled') \
          AND w.finished_at < now() - $2::bigint * interval '1 millisecond' \
        ORDER BY w.finished_at DESC LIMIT $1 \
    ), found AS MATERIALIZED ( \
        SELECT p.shard_key, p.id, p.queue, p.ordering_key, p.finished_at, k.left_over, \
            k.first_key, k.first_id, k.first_status \
        FROM seen p \
        CROSS JOIN LATERAL ( \
            SELECT count(*) AS left_over, (array_agg(c.shard_key ORDER BY c.id))[1] AS first_key, \
                min(c.id) AS first_id, (array_agg(c.status ORDER BY c.id))[1] AS first_status \
            FROM workflow_status c \
            WHERE c.parent_shard_key = p.shard_key AND c.parent_id = p.id \
              AND c.parent_id IS NOT NULL \
              AND c.status IN ('waiting', 'scheduled', 'queued', 'running', 'held') \
              AND NOT (c.status = 'held' AND c.held_status = 'running') \
              AND c.abandon_on_parent_cancel IS NOT TRUE AND NOT c.cancel_requested) k \
        WHERE p.status = 'cancelled' AND k.left_over > 0 \
    ), shown AS ( \
        SELECT * FROM found ORDER BY id LIMIT $3 \
    ) \
    SELECT (SELECT count(*) FROM found) AS broken, \
        (SELECT count(*) FROM seen) >= $1 AS capped, \
        (SELECT count(*) FROM seen) AS scanned, \
        coalesce(array_agg(shard_key ORDER BY id), '{}') AS ex_shard_key, \
        coalesce(array_agg(id ORDER BY id), '{}') AS ex_id, \
        coalesce(array_agg(queue ORDER BY id), '{}') AS ex_queue, \
        coalesce(array_agg(ordering_key ORDER BY id), '{}') AS ex_key, \
        coalesce(array_agg('cancelled ' || round(extract(epoch FROM now() - finished_at)::numeric, 1) \
            || ' s ago with ' || left_over || ' child(ren) left uncancelled, first ' \
            || first_key || '-' || first_id || ' (' || first_status || ')' ORDER BY id), '{}') \
            AS ex_detail \
    FROM shown";

/// A cancel cascade owed longer than $2 ms (`shardq_cascades_owed`): a
/// cancelled workflow whose children, on any shard, no cascade has
/// reached to the end (the canceller's stopped, and the workers' pass
/// has not finished it: a child's shard down, its range moving, or no
/// worker running). The $1 oldest, by `owed_since` (the table's primary
/// key has each row once; a few rows: a cascade is paid within seconds).
/// Examples ($3): the oldest, with how long it has been owed.
pub const CHECK_CASCADE_OWED: &str = "WITH seen AS MATERIALIZED ( \
        SELECT o.shard_key, o.id, o.owed_since FROM shardq_cascades_owed o \
        WHERE o.owed_since < now() - $2::bigint * interval '1 millisecond' \
        ORDER BY o.owed_since LIMIT $1 \
    ), shown AS ( \
        SELECT s.shard_key, s.id, s.owed_since, w.queue, w.ordering_key FROM seen s \
        LEFT JOIN workflow_status w ON w.shard_key = s.shard_key AND w.id = s.id \
        ORDER BY s.owed_since LIMIT $3 \
    ) \
    SELECT (SELECT count(*) FROM seen) AS broken, \
        (SELECT count(*) FROM seen) >= $1 AS capped, \
        (SELECT count(*) FROM seen) AS scanned, \
        coalesce(array_agg(shard_key ORDER BY owed_since), '{}') AS ex_shard_key, \
        coalesce(array_agg(id ORDER BY owed_since), '{}') AS ex_id, \
        coalesce(array_agg(queue ORDER BY owed_since), '{}') AS ex_queue, \
        coalesce(array_agg(ordering_key ORDER BY owed_since), '{}') AS ex_key, \
        coalesce(array_agg('its children owed a cancel for ' \
            || round(extract(epoch FROM now() - owed_since)::numeric, 1) || ' s' \
            ORDER BY owed_since), '{}') AS ex_detail \
    FROM shown";
