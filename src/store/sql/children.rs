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
// The halves of one call, driven apart by the race tests.
#[cfg_attr(not(feature = "internal"), allow(dead_code))]
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
// The halves of one call, driven apart by the race tests.
#[cfg_attr(not(feature = "internal"), allow(dead_code))]
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

/// A child started on another shard, its first write on the parent's
/// shard (`shardq_child_intent`, migrations/functions/): step $5 of the
/// parent ($1, $2), fenced by ($3 owner, $4 fence), records the child's
/// identity ($6 shard key, $7 id, reserved on the child's shard) unless
/// one is recorded. Returns `state`, the identity to use and the parent's
/// deadline.
pub const CHILD_INTENT: &str = "SELECT state, child_shard_key, child_id, parent_deadline \
    FROM shardq_child_intent($1::int, $2::bigint, $3::text, $4::bigint, $5::text, $6::int, \
        $7::bigint, $8::text, $9::text)";

/// On the child's shard: inserts the child whose identity ($1 id, $2 shard
/// key) its parent recorded ([`CHILD_INTENT`]), once: a row with that id
/// makes it write nothing (a run that crashed after the insert runs it
/// again). $3 queue, $4 handler, $5 ordering key, $6 priority, $7 payload,
/// $8 delay ms, $9 attempts, $10 group, $11 and $12 the parent's shard key
/// and id, $13 whether a cancel of the parent leaves it running, $14 the
/// parent's deadline, $15 its own timeout ms: its deadline is the earlier.
/// Fenced by the shard map like an enqueue (SQ001 when the key is not
/// here). Returns a row when it inserted.
pub const CHILD_INSERT_ELSEWHERE: &str = "WITH fence AS MATERIALIZED ( \
        SELECT shardq_check_route(NULL, $2::int) AS ok) \
    INSERT INTO workflow_status \
        (id, shard_key, queue, handler, ordering_key, priority, payload, status, run_at, \
         max_attempts, job_group, parent_shard_key, parent_id, abandon_on_parent_cancel, \
         deadline_at) \
    OVERRIDING SYSTEM VALUE \
    SELECT $1::bigint, $2::int, $3::text, $4::text, $5::text, $6::int, $7::jsonb, \
        CASE WHEN $8::bigint > 0 THEN 'scheduled' ELSE 'queued' END, \
        now() + $8::bigint * interval '1 millisecond', $9::int, $10::text, $11::int, \
        $12::bigint, NULLIF($13::boolean, false), \
        least(CASE WHEN $13::boolean THEN NULL ELSE $14::timestamptz END, \
              now() + $15::bigint * interval '1 millisecond') \
    FROM fence WHERE fence.ok \
    ON CONFLICT (id, shard_key) DO NOTHING \
    RETURNING CASE WHEN status = 'queued' THEN pg_notify('shardq_ready', queue) END AS woken";

/// On the child's shard: one job id reserved there for the child (shard
/// key $1), after checking the shard holds that key (SQ001 when the
/// router's map is stale: nothing is recorded then). Ids taken here are
/// below every id a later move of the key's range lets its new shard make
/// (`ids_from`), so the id stays unique wherever the child is inserted.
pub const CHILD_RESERVE_ID: &str = "SELECT shardq_check_route(NULL, $1::int) AS ok, \
    (shardq_reserve_ids(1))[1] AS id";

/// A result step on a child on another shard, its first statement on the
/// parent's shard (`shardq_child_wait`): under the parent's lock, the
/// recorded result ($5 the step), or the wait recorded (child $6, $7) and
/// the parent's `run_at` set $8 ms ahead. Returns `owned`,
/// `cancel_requested`, `output` (NULL: read the child).
pub const CHILD_WAIT: &str = "SELECT owned, cancel_requested, output \
    FROM shardq_child_wait($1::int, $2::bigint, $3::text, $4::bigint, $5::text, $6::int, \
        $7::bigint, $8::bigint)";

/// On a parent's shard: the parent ($1 shard key, $2 id), running under
/// the claim ($3 owner, $4 fence), is due within $5 ms unless it is due
/// sooner. A parent whose child's shard did not answer its read parks with
/// this `run_at` (its park keeps it), instead of the hour its wait set.
pub const PARENT_RECHECK_SOON: &str = "UPDATE workflow_status \
    SET run_at = least(run_at, now() + $5::bigint * interval '1 millisecond') \
    WHERE shard_key = $1 AND id = $2 AND owner = $3 AND fence = $4 AND status = 'running'";

/// On the child's shard: child ($1 shard key, $2 id)'s status, output and
/// error; no row when it is not here (a held stand-in is not the child).
pub const CHILD_READ: &str = "SELECT status, output, error FROM workflow_status \
    WHERE shard_key = $1 AND id = $2 AND NOT (status = 'held' AND held_status = 'running')";

/// Up to $1 children on this shard whose final status is to wake a parent
/// on another shard (`parent_wake` set, the parent's key not this
/// shard's), with the index of that shard by this shard's map
/// (`to_index`), but those owed to the shards $2 (whose delivery is still
/// out: filtered before the limit, so wakes piling up for a shard that
/// does not answer never hide the others'). The relay takes them to the
/// parents' shards. The map is joined, not asked per row
/// (`shardq_owns_key`): flags of parents here, left for a moment by a
/// completion that found the parent's row busy, cost one index entry
/// each, not a function call planned per row.
pub const CHILD_WAKES_ELSEWHERE: &str = "SELECT w.shard_key, w.id, w.parent_shard_key, \
        w.parent_id, w.finished_at, r.shard_index AS to_index \
    FROM workflow_status w \
    JOIN shardq_map_ranges r ON r.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e) \
        AND r.first_key <= w.parent_shard_key AND w.parent_shard_key < r.end_key \
    WHERE w.parent_wake AND r.shard_index <> (SELECT m.shard_index FROM shardq_shard_map m) \
        AND r.shard_index <> ALL($2::int[]) \
    ORDER BY w.shard_key, w.id LIMIT $1";

/// On the children's shard: whether worker $2 holds the lease of relaying
/// the wakes owed to shard $1 (`shardq_relay_leases`), taking it when it
/// has expired (or was never taken) and renewing it for $3 ms when less
/// than half of that is left. A lease another process holds, or one this
/// worker holds with more than half left, writes nothing (no row lock):
/// the upsert runs only when it would change the row, and its own WHERE
/// decides again on the latest version; a lease that is due is held only
/// if the upsert renewed it, so a holder renewing at the last moment and a
/// taker after it never both hold it. `others_ms`: how long another
/// holder's lease lasts as read (NULL when this worker's, or none).
pub const RELAY_LEASE: &str = "WITH current AS ( \
        SELECT l.holder, l.until, l.until < now() AS expired, \
            l.until < now() + $3::bigint * interval '500 microseconds' AS due \
        FROM shardq_relay_leases l WHERE l.to_index = $1 \
    ), taken AS ( \
        INSERT INTO shardq_relay_leases AS l (to_index, holder, until) \
        SELECT $1, $2, now() + $3::bigint * interval '1 millisecond' \
        WHERE NOT EXISTS (SELECT 1 FROM current c \
                          WHERE NOT c.expired AND (c.holder <> $2 OR NOT c.due)) \
        ON CONFLICT (to_index) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until \
        WHERE l.until < now() \
           OR (l.holder = EXCLUDED.holder \
               AND l.until < now() + $3::bigint * interval '500 microseconds') \
        RETURNING 1 \
    ) \
    SELECT EXISTS (SELECT 1 FROM taken) \
        OR EXISTS (SELECT 1 FROM current WHERE holder = $2 AND NOT due) AS held, \
        (SELECT greatest(0, extract(epoch FROM c.until - now()) * 1000)::bigint \
         FROM current c WHERE c.holder <> $2) AS others_ms";

/// On the children's shard: worker $2 gives up its lease of relaying the
/// wakes owed to shard $1 (a delivery failed: another process, which may
/// reach that shard, takes it at once).
pub const RELAY_LEASE_GIVE_UP: &str = "UPDATE shardq_relay_leases SET until = now() \
    WHERE to_index = $1 AND holder = $2 AND until > now()";

/// On a parent's shard: the relayed wakes of children ($1 parents' shard
/// keys, $2 parents' ids, $3 children's shard keys, $4 children's ids),
/// each tried (`shardq_wake_parent`); returns the children whose wake is
/// done (a parent locked now, or not here, is left for the next pass).
pub const CHILD_WAKE_RELAYED: &str = "SELECT c.shard_key, c.id \
    FROM unnest($1::int[], $2::bigint[], $3::int[], $4::bigint[]) \
        AS c(parent_shard_key, parent_id, shard_key, id) \
    WHERE shardq_wake_parent(c.parent_shard_key, c.parent_id, c.shard_key, c.id)";

/// On the children's shard: clears the flags of the children ($1 shard
/// keys, $2 ids) whose wakes the parents' shard has done, if they are
/// still the flags of the finishes read ($3 the children's `finished_at`
/// then): a child retried and finished again since owes a wake of its own.
pub const CHILD_WAKES_RELAYED: &str = "UPDATE workflow_status w SET parent_wake = NULL \
    FROM unnest($1::int[], $2::bigint[], $3::timestamptz[]) AS c(shard_key, id, finished_at) \
    WHERE w.shard_key = c.shard_key AND w.id = c.id AND w.parent_wake \
        AND w.finished_at IS NOT DISTINCT FROM c.finished_at";

/// The children the workflows ($1 shard keys, $2 ids) started, by their
/// `shardq:child:N` starts and `shardq:child:N:id` identities (a child
/// started here may have moved away since), for the cancel cascade: which
/// shards to ask for unfinished children. `started` is false for an
/// identity whose start is not recorded: its row may not be there yet (the
/// cascade then writes a stand-in, [`CHILD_STAND_INS`]), with the queue
/// and handler the identity names (NULL for an identity recorded before
/// it named them: the parent's then).
pub const CHILDREN_ELSEWHERE: &str = "SELECT DISTINCT \
        (s.output->>'child_shard_key')::int AS child_shard_key, \
        (s.output->>'child_id')::bigint AS child_id, \
        p.shard_key AS parent_shard_key, p.id AS parent_id, \
        s.step_name !~ ':id$' OR EXISTS (SELECT 1 FROM workflow_steps d \
            WHERE d.shard_key = s.shard_key AND d.workflow_id = s.workflow_id \
              AND d.step_name = left(s.step_name, -3)) AS started, \
        coalesce(s.output->>'queue', w.queue) AS queue, \
        coalesce(s.output->>'handler', w.handler) AS handler \
    FROM unnest($1::int[], $2::bigint[]) AS p(shard_key, id) \
    JOIN workflow_steps s ON s.shard_key = p.shard_key AND s.workflow_id = p.id \
    JOIN workflow_status w ON w.shard_key = p.shard_key AND w.id = p.id \
    WHERE s.step_name ~ '^shardq:child:[0-9]+(:id)?$'";

/// On a child's shard, for the cancel cascade: a cancelled stand-in for
/// each child ($1 shard keys, $2 ids, $3 queues, $4 handlers, $5 and $6
/// the parents' shard keys and ids) whose identity its parent recorded but
/// not its start, unless a row has that id. The parent is cancelled, so
/// its run's insert of the child (`ON CONFLICT DO NOTHING` on the id)
/// then writes nothing: no child starts after its parent's cancel, even
/// when the parent's process dies before it could cancel the child
/// itself. A child inserted first is found by the cascade's next read
/// (an insert racing this one is waited for). Keys this shard does not
/// hold are left out (a stale map), and so are keys whose range is moving
/// (the move's hold trigger would refuse an id from before the move, or
/// write the stand-in `held`): returns how many it left out, and the
/// cascade stays owed (`shardq_cascades_owed`) and is run again, once the
/// move is over or the map reloaded. Its error text marks it as a
/// stand-in: `JOB_RETRY` refuses it.
pub const CHILD_STAND_INS: &str = "WITH c AS MATERIALIZED ( \
        SELECT c.*, shardq_owns_key(c.shard_key) \
            AND NOT EXISTS (SELECT 1 FROM shardq_map_moves v \
                WHERE v.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e) \
                  AND v.state <> 'released' AND v.first_key <= c.shard_key \
                  AND c.shard_key < v.end_key) AS here \
        FROM unnest($1::int[], $2::bigint[], $3::text[], $4::text[], $5::int[], $6::bigint[]) \
            AS c(shard_key, id, queue, handler, parent_shard_key, parent_id)), \
    written AS (INSERT INTO workflow_status AS w \
        (id, shard_key, queue, handler, status, finished_at, error, parent_shard_key, parent_id) \
        OVERRIDING SYSTEM VALUE \
        SELECT c.id, c.shard_key, c.queue, c.handler, 'cancelled', now(), \
            'cancelled with its parent before it started', c.parent_shard_key, c.parent_id \
        FROM c WHERE c.here \
        ON CONFLICT (id, shard_key) DO NOTHING) \
    SELECT count(*) FILTER (WHERE NOT c.here) AS left_out FROM c";

/// The wakes children on this shard owe parents on other shards, by the
/// parents' shard key: how many, and how long the oldest has waited since
/// its child finished (seconds, the shard's clock; 0 when none has a
/// `finished_at`: a child retried since keeps its flag). Read by the
/// metrics, `shardq status` and the dashboard.
pub const CHILD_WAKES_OWED_BY_KEY: &str = "SELECT w.parent_shard_key, count(*) AS pending, \
        coalesce(extract(epoch FROM now() - min(w.finished_at)), 0)::float8 AS oldest_s \
    FROM workflow_status w \
    WHERE w.parent_wake AND NOT EXISTS (SELECT 1 FROM shardq_map_ranges r \
        WHERE r.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e) \
          AND r.shard_index = (SELECT m.shard_index FROM shardq_shard_map m) \
          AND r.first_key <= w.parent_shard_key AND w.parent_shard_key < r.end_key) \
    GROUP BY w.parent_shard_key";
