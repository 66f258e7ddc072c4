//! Child workflows: starting one from a workflow's step, the step that
//! waits for its result, the wake its completion gives the parent, and the
//! cancel cascade's reads.
//!
//! A parent's park and its child's completion are ordered by the parent's
//! row lock, never by a wait while holding the child's: the park locks the
//! parent ([`CHILD_RESULT_LOCK`]) and then reads the child in a statement
//! of its own ([`CHILD_RESULT_DECIDE`]); the child's final status is
//! written under the child's row lock by whoever writes it (a completion,
//! a cancel, a recovery), and the trigger that fires with it only *tries*
//! the parent's lock (`shardq_wake_parent`, which says why both orders
//! wake the parent). A completion batch holds its rows and tries
//! parents; it never waits for one, so two batches (or a batch and a
//! park) cannot wait on each other in a cycle.

/// Starts child step $5 of workflow ($1, $2), fenced by ($3 owner, $4
/// fence): `shardq_start_child` (migrations/functions/), one call, one
/// transaction. Its other params: $6 queue, $7 handler, $8 payload, $9
/// ordering key, $10 group, $11 priority, $12 delay in ms, $13 attempts,
/// $14 whether a cancel of the parent leaves it running.
pub const CHILD_START: &str = "SELECT state, child_shard_key, child_id, child_index \
    FROM shardq_start_child($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)";

/// Lowers the deadline of the child step $3 of workflow ($1, $2) just
/// started to $4 ms from now when that is earlier than the one it inherited
/// (NewJob::timeout on a child: the earlier of its own and its parent's).
/// Run only after [`CHILD_START`] answered `started`, in its transaction:
/// the child's row is this transaction's own insert, which no other
/// transaction sees yet, so no writer can run between the two statements
/// on it.
pub const CHILD_OWN_DEADLINE: &str = "UPDATE workflow_status w \
    SET deadline_at = least(w.deadline_at, now() + $4::bigint * interval '1 millisecond') \
    FROM workflow_steps s \
    WHERE s.shard_key = $1 AND s.workflow_id = $2 AND s.step_name = $3 \
        AND w.shard_key = (s.output->>'child_shard_key')::int \
        AND w.id = (s.output->>'child_id')::bigint";

/// A result step's first statement: the parent's row lock and whether this
/// claim holds it, as a recv's ([`super::messages::MESSAGE_RECV_LOCK`], which lists
/// the writers it excludes). The wake of a finished child
/// (`shardq_wake_parent`) tries the same lock: it cannot run between this
/// statement and [`CHILD_RESULT_DECIDE`].
pub const CHILD_RESULT_LOCK: &str = super::messages::MESSAGE_RECV_LOCK;

/// A result step's second statement (`shardq_child_result_decide`, in
/// migrations/functions/, which says what can run between it and the
/// lock), under [`CHILD_RESULT_LOCK`] (a new snapshot: it sees a child
/// whose final status committed before the lock was granted): result step
/// $3 of the parent ($1, $2) on child ($4, $5) decides once, only by
/// inserting; while the child runs, the wait is recorded and the parent's
/// `run_at` set $6 ms ahead. Returns the step's `output` (NULL while it
/// waits), whether the child exists (`found`), and the re-check time
/// (`until`).
pub const CHILD_RESULT_DECIDE: &str = "SELECT * FROM shardq_child_result_decide($1::int, \
    $2::bigint, $3::text, $4::int, $5::bigint, $6::bigint)";

/// A result step in one call (`shardq_child_result`): [`CHILD_RESULT_LOCK`]
/// by claim ($3 owner, $4 fence), then, when it holds the parent and no
/// cancel was asked, [`CHILD_RESULT_DECIDE`] of step $5 on child ($6, $7),
/// re-check $8 ms, in a statement of its own; one transaction. Returns
/// both answers (the decision's NULL when it did not run).
pub const CHILD_RESULT: &str = "SELECT * FROM shardq_child_result($1::int, $2::bigint, \
    $3::text, $4::bigint, $5::text, $6::int, $7::bigint, $8::bigint)";

/// The unfinished children of the workflows ($1 shard keys, $2 ids) that
/// a cancel of their parent cancels (not `ChildPolicy::Abandon`), for the
/// cancel cascade: their keys and ids (one probe of the children index
/// per parent).
pub const CHILDREN_UNFINISHED: &str = "SELECT c.shard_key, c.id \
    FROM unnest($1::int[], $2::bigint[]) AS p(shard_key, id) \
    JOIN workflow_status c ON c.parent_shard_key = p.shard_key AND c.parent_id = p.id \
    WHERE c.parent_id IS NOT NULL \
        AND c.status IN ('waiting', 'scheduled', 'queued', 'running', 'held') \
        AND c.abandon_on_parent_cancel IS NOT TRUE \
    ORDER BY c.id";

/// Settles up to $1 wakes of parents that a child's completion left to the
/// promotion (`shardq_wake_parents`: tries, never waits). Returns how many.
pub const CHILD_WAKE_PENDING: &str = "SELECT shardq_wake_parents($1::int) AS settled";
