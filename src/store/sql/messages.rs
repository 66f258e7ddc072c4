//! Messages to a workflow: its mailbox (`workflow_messages`), the sends
//! that fill it and the recv steps that take from it.
//!
//! A send and a recv of one workflow are decided under its row's lock: a
//! send holds `FOR NO KEY UPDATE` (which also orders two sends), a recv
//! `FOR UPDATE`; each decides in a statement after the one that took the
//! lock (the send's two are in `shardq_send_row`, which SQL callers reach
//! through `shardq_send`), whose snapshot sees every commit made before the lock was granted.
//! So a message that committed before a recv got the lock is seen by it,
//! and a recv that decided first (a timeout) committed before the send
//! looked for a waiting recv. No writer can change what either decides
//! between its two statements: every writer of messages takes the lock, and
//! the recv's wait record is written under it.

/// A send (migrations/functions/shardq_send_row.sql, which says how it
/// is ordered with a recv, and which writers can run between its two
/// statements: none that changes what it decides): locks the recipient's
/// row (`FOR NO KEY UPDATE`), then, in a later statement, writes the
/// message and wakes the workflow when one of its recv steps waits on the
/// topic. Its params: $1 shard key, $2 id, $3 topic, $4 message, $5
/// idempotency key or NULL. Returns the workflow's `status` (NULL: none
/// here), whether the message was `written` and whether the workflow was
/// `woken`.
pub const MESSAGE_SEND: &str =
    "SELECT status, written, woken FROM shardq_send_row($1, $2, $3, $4, $5)";

/// Whether workflow ($1, $2)'s mailbox holds a message sent under
/// idempotency key $3: a send refused because the workflow finished or
/// started moving may repeat one that committed before.
pub const MESSAGE_KEY_USED: &str = "SELECT EXISTS (SELECT 1 FROM workflow_messages \
    WHERE shard_key = $1 AND workflow_id = $2 AND idempotency_key = $3)";

/// A recv's first statement (`shardq_hold_workflow`, in
/// migrations/functions/): locks the workflow's row (`FOR UPDATE`:
/// conflicts with a send's lock, a completion, a recovery, a
/// cancellation) and says whether this claim ($3 owner, $4 fence) still
/// holds it (`owned`) and whether its cancellation was asked
/// (`cancel_requested`). Its params: $1 shard key, $2 id. Between it and
/// [`MESSAGE_RECV_TAKE`], no writer changes what that decides: a send, a
/// step record, a recovery, a cancellation and the job's deletion all need
/// a lock that conflicts with this one.
// The halves of one call, driven apart by the race tests.
#[cfg_attr(not(feature = "internal"), allow(dead_code))]
pub const MESSAGE_RECV_LOCK: &str =
    "SELECT * FROM shardq_hold_workflow($1::int, $2::bigint, $3::text, $4::bigint)";

/// A recv's second statement (`shardq_recv_take`), under
/// [`MESSAGE_RECV_LOCK`] (a new snapshot: it sees every message committed
/// before the lock was granted), run only when the claim holds the
/// workflow: recv step $3 of topic $4 decides, once, and only by inserting
/// (the function's comment says how). Returns the step's `output`, or the
/// wait's while it waits (deadline: the shard's clock plus $5 µs, written
/// by the first call), `wait_recorded` and `parked` (the `run_at` set).
// The halves of one call, driven apart by the race tests.
#[cfg_attr(not(feature = "internal"), allow(dead_code))]
pub const MESSAGE_RECV_TAKE: &str =
    "SELECT * FROM shardq_recv_take($1::int, $2::bigint, $3::text, $4::text, $5::bigint)";

/// A recv step in one call (`shardq_recv`): [`MESSAGE_RECV_LOCK`] by
/// claim ($3 owner, $4 fence), then, when it holds the workflow and no
/// cancel was asked, [`MESSAGE_RECV_TAKE`] of step $5, topic $6, $7 µs, in
/// a statement of its own; one transaction. Returns both answers (the
/// take's NULL when it did not run).
pub const MESSAGE_RECV: &str = "SELECT * FROM shardq_recv($1::int, $2::bigint, $3::text, \
    $4::bigint, $5::text, $6::text, $7::bigint)";
