//! Child workflows whose key routes them to another shard than their
//! parent's: their start, their result step, the wakes their completions
//! relay to their parents, and which shards the cancel cascade asks.
//!
//! No write spans two shards. A start is four round trips, each
//! idempotent: an id reserved on the child's shard, that identity recorded
//! as a step of the parent (`shardq:child:N:id`, fenced), the child's row
//! inserted with it (a row with that id already there makes it write
//! nothing), then the start recorded (`shardq:child:N`). A crash between any
//! two leaves at most one child: the next run finds the identity and
//! inserts nothing new, or finds the start and does nothing.
//!
//! A result records its wait on the parent's shard first, then reads the
//! child on its own shard: a final status committed after that read flags
//! the child (`parent_wake`, as on one shard), and a relay on the
//! child's shard takes the flag to the parent's shard, where
//! `shardq_wake_parent` finds the wait. Either the read sees the child
//! finished or the relay finds the wait: no lost wake-up. The relay's loop
//! is `worker::wake_relay`.

use super::exec;
use super::sql::{self, Param};
use crate::job::JobId;
use crate::shards::{Shard, ShardError, ShardSet};
use serde_json::Value;
use std::time::{Duration, SystemTime};
use tokio_postgres::types::Type;

/// What the intent step ([`intent`]) found or wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// The start is recorded: this child, nothing to do.
    Started(JobId),
    /// Insert this child (its identity is recorded), with the parent's
    /// deadline.
    Reserved(JobId, Option<SystemTime>),
    /// The parent's cancellation was asked: nothing written.
    Cancelled,
    /// This claim no longer holds the parent.
    NotHeld,
}

/// Reserves one job id for a child of shard key `shard_key` on its shard
/// (`shard`), which must hold that key ([`sql::CHILD_RESERVE_ID`]).
///
/// # Errors
///
/// [`ShardError`] when the shard fails or does not hold the key (SQ001).
pub async fn reserve_id(shard: &Shard, shard_key: i32) -> Result<i64, ShardError> {
    let row = exec::query_one(shard, sql::CHILD_RESERVE_ID, &[(&shard_key, Type::INT4)]).await?;
    Ok(row.get("id"))
}

/// The parent's claim of a child started on another shard.
#[derive(Debug, Clone, Copy)]
pub struct ParentStep<'a> {
    /// The parent workflow.
    pub parent: JobId,
    /// The step's name (`shardq:child:N`, or its `:result`).
    pub name: &'a str,
    /// The worker holding the parent.
    pub owner: &'a str,
    /// The fence of its claim.
    pub fence: i64,
}

/// A child's identity, as its parent records it ([`intent`]).
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    /// Its id, reserved on its shard ([`reserve_id`]).
    pub id: JobId,
    /// Its queue.
    pub queue: &'a str,
    /// Its handler.
    pub handler: &'a str,
}

/// Records the child's identity `child` as step `name:id` of the parent
/// on its shard, unless one is ([`sql::CHILD_INTENT`]).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe in effect: a repeat finds the identity recorded.
pub async fn intent(
    shard: &Shard,
    p: ParentStep<'_>,
    child: Identity<'_>,
) -> Result<Intent, ShardError> {
    let row = exec::query_one(
        shard,
        sql::CHILD_INTENT,
        &[
            (&p.parent.shard_key, Type::INT4),
            (&p.parent.id, Type::INT8),
            (&p.owner, Type::TEXT),
            (&p.fence, Type::INT8),
            (&p.name, Type::TEXT),
            (&child.id.shard_key, Type::INT4),
            (&child.id.id, Type::INT8),
            (&child.queue, Type::TEXT),
            (&child.handler, Type::TEXT),
        ],
    )
    .await?;
    let recorded = || JobId {
        shard_key: row.get("child_shard_key"),
        id: row.get("child_id"),
    };
    Ok(match row.get::<_, &str>("state") {
        "started" => Intent::Started(recorded()),
        "reserved" => Intent::Reserved(recorded(), row.get("parent_deadline")),
        "cancelled" => Intent::Cancelled,
        _ => Intent::NotHeld,
    })
}

/// A child to insert on its shard ([`insert`]).
#[derive(Debug, Clone, Copy)]
pub struct ChildRow<'a> {
    /// Its identity (reserved, recorded by [`intent`]).
    pub id: JobId,
    /// Its parent.
    pub parent: JobId,
    /// The parent's deadline, inherited unless it abandons on cancel.
    pub parent_deadline: Option<SystemTime>,
    /// The rest of it, as [`super::children::StartChild`] has it.
    pub job: &'a super::children::StartChild<'a>,
}

/// Inserts the child on its shard once ([`sql::CHILD_INSERT_ELSEWHERE`]).
///
/// # Errors
///
/// [`ShardError`] when the shard fails, or does not hold the child's key
/// (SQ001: the map moved; the next run routes again).
///
/// # Cancel safety
///
/// Cancel safe in effect: a repeat inserts nothing.
pub async fn insert(shard: &Shard, c: ChildRow<'_>) -> Result<(), ShardError> {
    let j = c.job;
    let delay_ms = i64::try_from(j.delay.as_millis()).unwrap_or(i64::MAX);
    let params: [Param; 15] = [
        (&c.id.id, Type::INT8),
        (&c.id.shard_key, Type::INT4),
        (&j.queue, Type::TEXT),
        (&j.handler, Type::TEXT),
        (&j.ordering_key, Type::TEXT),
        (&j.priority, Type::INT4),
        (j.payload, Type::JSONB),
        (&delay_ms, Type::INT8),
        (&j.max_attempts, Type::INT4),
        (&j.group, Type::TEXT),
        (&c.parent.shard_key, Type::INT4),
        (&c.parent.id, Type::INT8),
        (&j.abandon_on_parent_cancel, Type::BOOL),
        (&c.parent_deadline, Type::TIMESTAMPTZ),
        (&j.timeout_ms, Type::INT8),
    ];
    exec::query(shard, sql::CHILD_INSERT_ELSEWHERE, &params).await?;
    Ok(())
}

/// Inserts the child where its key routes now ([`insert`]), unless its
/// identity was recorded by an earlier run (`earlier`) and a row with its
/// id is on another shard: that run inserted it, and it finished (or ran)
/// on a shard its key's range has left since (a move copies unclaimed
/// jobs only), where inserting it again would run it twice. Probes each
/// other shard once, on that rare path only (a run that died between the
/// insert and the start's record).
///
/// # Errors
///
/// [`ShardError`] when a shard fails (the attempt is retried), or the
/// child's shard does not hold its key (SQ001).
///
/// # Cancel safety
///
/// Cancel safe in effect: a repeat inserts nothing.
pub async fn insert_once(
    shards: &ShardSet,
    c: ChildRow<'_>,
    earlier: bool,
) -> Result<(), ShardError> {
    let there = shards.for_key(c.id.shard_key);
    if earlier {
        for shard in shards.all() {
            if shard.index != there.index && super::jobs::exists(shard, c.id).await? {
                return Ok(());
            }
        }
    }
    insert(there, c).await
}

/// The parent's side of a result step on a child elsewhere
/// ([`sql::CHILD_WAIT`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Wait {
    /// The result is recorded (`status`, `output`, `error`).
    Decided(Value),
    /// The wait is recorded and the parent's re-check set: read the child.
    Recorded,
    /// The parent's cancellation was asked.
    Cancelled,
    /// This claim no longer holds the parent.
    NotHeld,
}

/// Locks the parent, returns its recorded result or records its wait on
/// `child` ([`sql::CHILD_WAIT`]), re-checking after `recheck` at most.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe in effect: a repeat finds the wait recorded.
pub async fn wait(
    shard: &Shard,
    p: ParentStep<'_>,
    child: JobId,
    recheck: Duration,
) -> Result<Wait, ShardError> {
    let recheck_ms = i64::try_from(recheck.as_millis()).unwrap_or(i64::MAX);
    let row = exec::query_one(
        shard,
        sql::CHILD_WAIT,
        &[
            (&p.parent.shard_key, Type::INT4),
            (&p.parent.id, Type::INT8),
            (&p.owner, Type::TEXT),
            (&p.fence, Type::INT8),
            (&p.name, Type::TEXT),
            (&child.shard_key, Type::INT4),
            (&child.id, Type::INT8),
            (&recheck_ms, Type::INT8),
        ],
    )
    .await?;
    if row.get::<_, bool>("cancel_requested") {
        return Ok(Wait::Cancelled);
    }
    if !row.get::<_, bool>("owned") {
        return Ok(Wait::NotHeld);
    }
    Ok(match row.get::<_, Option<Value>>("output") {
        Some(output) => Wait::Decided(output),
        None => Wait::Recorded,
    })
}

/// The child on its shard: its final outcome as a result step records it
/// (`status`, `output`, `error`), `Some(None)` while it has not finished,
/// `None` when it is not there ([`sql::CHILD_READ`]).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn read_child(shard: &Shard, child: JobId) -> Result<Option<Option<Value>>, ShardError> {
    let row = exec::query_opt(
        shard,
        sql::CHILD_READ,
        &[(&child.shard_key, Type::INT4), (&child.id, Type::INT8)],
    )
    .await?;
    let Some(row) = row else { return Ok(None) };
    let status: String = row.get("status");
    if !matches!(
        status.as_str(),
        "succeeded" | "failed" | "dead" | "cancelled"
    ) {
        return Ok(Some(None));
    }
    Ok(Some(Some(serde_json::json!({
        "status": status,
        "output": row.get::<_, Option<Value>>("output"),
        "error": row.get::<_, Option<String>>("error"),
    }))))
}

/// Makes parent `p` (running, this claim's) due within `after`, unless it
/// is due sooner ([`sql::PARENT_RECHECK_SOON`]): its park then keeps that
/// time. Returns whether the claim still held it.
///
/// # Errors
///
/// [`ShardError`] when the parent's shard fails.
///
/// # Cancel safety
///
/// Cancel safe in effect: one statement; a repeat sets the same bound.
pub async fn recheck_soon(
    shard: &Shard,
    p: ParentStep<'_>,
    after: Duration,
) -> Result<bool, ShardError> {
    let ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
    let changed = exec::execute(
        shard,
        sql::PARENT_RECHECK_SOON,
        &[
            (&p.parent.shard_key, Type::INT4),
            (&p.parent.id, Type::INT8),
            (&p.owner, Type::TEXT),
            (&p.fence, Type::INT8),
            (&ms, Type::INT8),
        ],
    )
    .await?;
    Ok(changed > 0)
}

/// Children's wakes read per pass and shard at most.
pub(crate) const RELAY_BATCH: usize = 1_000;

/// A child's wake owed to its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwedWake {
    /// The parent, on another shard.
    pub parent: JobId,
    /// The child, finished.
    pub child: JobId,
    /// When the child finished, as read: the wake of that finish (a child
    /// retried and finished again owes a new one).
    pub finished_at: Option<SystemTime>,
}

/// The wakes that children on shard `index` owe parents on other shards
/// ([`sql::CHILD_WAKES_ELSEWHERE`]), by the index of the parents' shard (by
/// shard `index`'s map), but those owed to the shards `skip`.
///
/// # Errors
///
/// [`ShardError`] when shard `index` fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn wakes_owed(
    shards: &ShardSet,
    index: usize,
    skip: &[usize],
) -> Result<std::collections::BTreeMap<usize, Vec<OwedWake>>, ShardError> {
    let skip: Vec<i32> = skip.iter().map(|&s| s as i32).collect();
    let limit = RELAY_BATCH as i64;
    let rows = exec::query(
        shards.get(index),
        sql::CHILD_WAKES_ELSEWHERE,
        &[(&limit, Type::INT8), (&skip, Type::INT4_ARRAY)],
    )
    .await?;
    let mut by_shard: std::collections::BTreeMap<usize, Vec<OwedWake>> = Default::default();
    for r in &rows {
        let parent = JobId {
            shard_key: r.get("parent_shard_key"),
            id: r.get("parent_id"),
        };
        let child = JobId {
            shard_key: r.get("shard_key"),
            id: r.get("id"),
        };
        // A shard this process's list does not have (a newer list): left
        // to the processes that have it.
        let to = r.get::<_, i32>("to_index") as usize;
        if to != index && to < shards.len() {
            by_shard.entry(to).or_default().push(OwedWake {
                parent,
                child,
                finished_at: r.get("finished_at"),
            });
        }
    }
    Ok(by_shard)
}

/// The answer to [`relay_lease`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayLease {
    /// This worker holds it: it delivers.
    Held,
    /// Another process holds it, for about this much longer (zero when it
    /// was just taken by another): leave those wakes to it until then.
    Elsewhere(Duration),
}

/// Whether `holder` (a worker's id) holds the lease of relaying the wakes
/// children on shard `from` owe parents on shard `to`, taking it when it
/// has expired and renewing it for `ttl` when less than half is left
/// ([`sql::RELAY_LEASE`]): one process delivers them, and another takes
/// over once its holder stops renewing it.
///
/// # Errors
///
/// [`ShardError`] when shard `from` fails.
///
/// # Cancel safety
///
/// Cancel safe: a lease taken and not used expires.
pub async fn relay_lease(
    shards: &ShardSet,
    from: usize,
    to: usize,
    holder: &str,
    ttl: Duration,
) -> Result<RelayLease, ShardError> {
    let to = to as i32;
    let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    let row = exec::query_one(
        shards.get(from),
        sql::RELAY_LEASE,
        &[(&to, Type::INT4), (&holder, Type::TEXT), (&ms, Type::INT8)],
    )
    .await?;
    if row.get("held") {
        return Ok(RelayLease::Held);
    }
    let left = row.get::<_, Option<i64>>("others_ms").unwrap_or(0);
    Ok(RelayLease::Elsewhere(Duration::from_millis(
        u64::try_from(left).unwrap_or(0),
    )))
}

/// Gives up `holder`'s lease of relaying the wakes owed from shard `from`
/// to shard `to` ([`sql::RELAY_LEASE_GIVE_UP`]): after a failed delivery,
/// so that a process that can reach `to` takes over at once instead of
/// waiting for a lease this one would keep renewing.
///
/// # Errors
///
/// [`ShardError`] when shard `from` fails (the lease then runs out).
///
/// # Cancel safety
///
/// Cancel safe.
pub async fn give_up_relay_lease(
    shards: &ShardSet,
    from: usize,
    to: usize,
    holder: &str,
) -> Result<(), ShardError> {
    let to = to as i32;
    exec::execute(
        shards.get(from),
        sql::RELAY_LEASE_GIVE_UP,
        &[(&to, Type::INT4), (&holder, Type::TEXT)],
    )
    .await?;
    Ok(())
}

/// Delivers `wakes` that children on shard `from` owe parents on shard
/// `to`: the parents' shard tries each ([`sql::CHILD_WAKE_RELAYED`]), then
/// the flags of those done are cleared on `from`
/// ([`sql::CHILD_WAKES_RELAYED`]); the others stay for the next pass.
/// Returns how many were done.
///
/// # Errors
///
/// [`ShardError`] when either shard fails (nothing is cleared that was
/// not delivered).
///
/// # Cancel safety
///
/// Cancel safe in effect: a wake delivered twice wakes nothing more.
pub async fn deliver(
    shards: &ShardSet,
    from: usize,
    to: usize,
    wakes: &[OwedWake],
) -> Result<u64, ShardError> {
    let parent_keys: Vec<i32> = wakes.iter().map(|w| w.parent.shard_key).collect();
    let parent_ids: Vec<i64> = wakes.iter().map(|w| w.parent.id).collect();
    let child_keys: Vec<i32> = wakes.iter().map(|w| w.child.shard_key).collect();
    let child_ids: Vec<i64> = wakes.iter().map(|w| w.child.id).collect();
    let done = exec::query(
        shards.get(to),
        sql::CHILD_WAKE_RELAYED,
        &[
            (&parent_keys, Type::INT4_ARRAY),
            (&parent_ids, Type::INT8_ARRAY),
            (&child_keys, Type::INT4_ARRAY),
            (&child_ids, Type::INT8_ARRAY),
        ],
    )
    .await?;
    if done.is_empty() {
        return Ok(0);
    }
    let done: Vec<&OwedWake> = done
        .iter()
        .filter_map(|r| {
            let (shard_key, id) = (r.get("shard_key"), r.get("id"));
            wakes.iter().find(|w| w.child == JobId { shard_key, id })
        })
        .collect();
    let keys: Vec<i32> = done.iter().map(|w| w.child.shard_key).collect();
    let ids: Vec<i64> = done.iter().map(|w| w.child.id).collect();
    let finished: Vec<Option<SystemTime>> = done.iter().map(|w| w.finished_at).collect();
    exec::execute(
        shards.get(from),
        sql::CHILD_WAKES_RELAYED,
        &[
            (&keys, Type::INT4_ARRAY),
            (&ids, Type::INT8_ARRAY),
            (&finished, Type::TIMESTAMPTZ_ARRAY),
        ],
    )
    .await?;
    Ok(done.len() as u64)
}

/// The wakes children on one shard owe parents on another, as the
/// metrics and `shardq status --shards` show them ([`owed_summary`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OwedToShard {
    /// The parents' shard (its index).
    pub to: usize,
    /// How many wakes wait to be delivered there.
    pub pending: i64,
    /// Seconds since the oldest one's child finished.
    pub oldest_s: f64,
}

/// The wakes children on shard `index` owe parents on other shards, by
/// the parents' shard ([`sql::CHILD_WAKES_OWED_BY_KEY`]).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn owed_summary(shards: &ShardSet, index: usize) -> Result<Vec<OwedToShard>, ShardError> {
    let rows = exec::query(shards.get(index), sql::CHILD_WAKES_OWED_BY_KEY, &[]).await?;
    let mut by_shard: std::collections::BTreeMap<usize, OwedToShard> = Default::default();
    for r in &rows {
        let to = shards.for_key(r.get("parent_shard_key")).index;
        let (pending, oldest_s): (i64, f64) = (r.get("pending"), r.get("oldest_s"));
        let owed = by_shard.entry(to).or_insert(OwedToShard {
            to,
            pending: 0,
            oldest_s: 0.0,
        });
        owed.pending += pending;
        owed.oldest_s = owed.oldest_s.max(oldest_s);
    }
    Ok(by_shard.into_values().collect())
}

/// A child a workflow started on another shard, as the cancel cascade
/// reads it from the parent's steps ([`children_started`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartedChild {
    /// The shard its key routes to (an index in this process's map).
    pub shard: usize,
    /// The child.
    pub id: JobId,
    /// Its parent.
    pub parent: JobId,
    /// Whether the parent recorded its start; if not, its row may not be
    /// on its shard yet ([`stand_ins`]).
    pub started: bool,
    /// Its queue.
    pub queue: String,
    /// Its handler.
    pub handler: String,
}

/// The children that the workflows `parents` on shard `index` started or
/// named ([`sql::CHILDREN_ELSEWHERE`]), each with the shard its key routes
/// to now: on this shard too (a started child routed here may run where
/// its key's range is moving from).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn children_started(
    shards: &ShardSet,
    index: usize,
    parents: &[JobId],
) -> Result<Vec<StartedChild>, ShardError> {
    let keys: Vec<i32> = parents.iter().map(|p| p.shard_key).collect();
    let ids: Vec<i64> = parents.iter().map(|p| p.id).collect();
    let rows = exec::query(
        shards.get(index),
        sql::CHILDREN_ELSEWHERE,
        &[(&keys, Type::INT4_ARRAY), (&ids, Type::INT8_ARRAY)],
    )
    .await?;
    let mut out: Vec<StartedChild> = rows
        .iter()
        .map(|r| {
            let id = JobId {
                shard_key: r.get("child_shard_key"),
                id: r.get("child_id"),
            };
            StartedChild {
                shard: shards.for_key(id.shard_key).index,
                id,
                parent: JobId {
                    shard_key: r.get("parent_shard_key"),
                    id: r.get("parent_id"),
                },
                started: r.get("started"),
                queue: r.get("queue"),
                handler: r.get("handler"),
            }
        })
        .collect();
    // A child with its start and its identity recorded: once, started.
    out.sort_by_key(|c| (c.id.shard_key, c.id.id, !c.started));
    out.dedup_by_key(|c| c.id);
    Ok(out)
}

/// Writes a cancelled stand-in on `shard` for each of `children` (started
/// by cancelled parents, their starts not recorded) that has no row there
/// ([`sql::CHILD_STAND_INS`]): the parent's run cannot insert it after.
/// Returns how many it left out: children whose key this shard does not
/// hold by its map now, or whose range is being moved (the cascade is
/// then run again later).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe in effect: one statement; a repeat writes nothing twice.
pub async fn stand_ins(shard: &Shard, children: &[&StartedChild]) -> Result<u64, ShardError> {
    if children.is_empty() {
        return Ok(0);
    }
    let keys: Vec<i32> = children.iter().map(|c| c.id.shard_key).collect();
    let ids: Vec<i64> = children.iter().map(|c| c.id.id).collect();
    let queues: Vec<&str> = children.iter().map(|c| c.queue.as_str()).collect();
    let handlers: Vec<&str> = children.iter().map(|c| c.handler.as_str()).collect();
    let parent_keys: Vec<i32> = children.iter().map(|c| c.parent.shard_key).collect();
    let parent_ids: Vec<i64> = children.iter().map(|c| c.parent.id).collect();
    let row = exec::query_one(
        shard,
        sql::CHILD_STAND_INS,
        &[
            (&keys, Type::INT4_ARRAY),
            (&ids, Type::INT8_ARRAY),
            (&queues, Type::TEXT_ARRAY),
            (&handlers, Type::TEXT_ARRAY),
            (&parent_keys, Type::INT4_ARRAY),
            (&parent_ids, Type::INT8_ARRAY),
        ],
    )
    .await?;
    Ok(row.get::<_, i64>("left_out") as u64)
}
