//! The cancel cascade: a cancelled workflow's unfinished children, and
//! theirs, on every shard they live on.

use super::children;
use super::children_elsewhere::{self, StartedChild};
use crate::job::JobId;
use crate::shards::{Shard, ShardError, ShardSet};
use std::collections::HashSet;
use tokio_postgres::types::Type;

/// Cancels the unfinished descendants of `parents` (on shard `index`),
/// level by level, on their shard and on the shards where they started
/// children (their `shardq:child:N:id` steps say which), but those
/// started with `ChildPolicy::Abandon` and theirs: each child as
/// [`super::jobs::cancel`] cancels one job, in a transaction of its own
/// that locks that child's row only (never a parent's while it waits for
/// a child's, so it cannot deadlock with a child's completion, which
/// holds the child and only tries its parent's lock). A child on another
/// shard whose start its parent had not recorded gets a cancelled
/// stand-in first when its row is not there yet
/// ([`children_elsewhere::stand_ins`]): the parent's run, or its process's
/// death, cannot start it after. A child not on the shard its key routes
/// to (it runs on the shard its range is moving from, or a move left it
/// there) is cancelled where it is. The cascade of `Client::cancel` and of
/// the deadline pass, and of the pass over the cascades owed
/// (`store::cascades_owed::run_due`). Returns how many it changed, and
/// whether it reached every child: not when a stand-in was left out (its
/// key's range is moving, or this process's map is stale), nor when a
/// started child was on no shard this process knows, so its cascade
/// stays owed. Each child is cancelled once per cascade, however many
/// ways it is found.
///
/// # Errors
///
/// [`ShardError`], the first one, when a shard fails: the others' children
/// are cancelled all the same, and those cancelled so far stay cancelled;
/// calling again goes on with the rest.
///
/// # Cancel safety
///
/// Not cancel safe: some children may be cancelled; calling again is
/// harmless.
pub async fn cancel_descendants(
    shards: &ShardSet,
    index: usize,
    parents: &[JobId],
) -> Result<Cascaded, ShardError> {
    let mut c = Cascade::default();
    // Parents, by the shard to read their children on.
    let mut levels = vec![(index, parents.to_vec())];
    while let Some((on, level)) = levels.pop() {
        if level.is_empty() {
            continue;
        }
        let elsewhere = match children_elsewhere::children_started(shards, on, &level).await {
            Ok(children) => children,
            Err(err) => {
                c.failed.get_or_insert(err);
                Vec::new()
            }
        };
        let mut asked: Vec<usize> = elsewhere.iter().map(|c| c.shard).collect();
        asked.push(on);
        asked.sort_unstable();
        asked.dedup();
        for at in asked {
            // Started children not on the shard their key routes to, while
            // its range moves (or by a stale map): each is where it runs.
            let started: Vec<JobId> = elsewhere
                .iter()
                .filter(|c| c.shard == at && c.started)
                .map(|c| c.id)
                .collect();
            match away_from(shards.get(at), &started).await {
                Ok(away) => {
                    for child in away {
                        match held_elsewhere(shards, at, child).await {
                            Ok(Some(there)) => {
                                if c.cancel(shards.get(there), child).await == Some(true) {
                                    levels.push((there, vec![child]));
                                }
                            }
                            // On no shard this process knows: its list or
                            // map is stale; a later pass looks again.
                            Ok(None) => c.left_out += 1,
                            Err(err) => {
                                c.failed.get_or_insert(err);
                            }
                        }
                    }
                }
                Err(err) => {
                    c.failed.get_or_insert(err);
                }
            }
            let mut unstarted: Vec<&StartedChild> = Vec::new();
            for child in elsewhere.iter().filter(|c| c.shard == at && !c.started) {
                match held_elsewhere(shards, at, child.id).await {
                    Ok(None) => unstarted.push(child),
                    Ok(Some(there)) => {
                        if c.cancel(shards.get(there), child.id).await == Some(true) {
                            // Its own children are next, where it is.
                            levels.push((there, vec![child.id]));
                        }
                    }
                    Err(err) => {
                        // A shard that does not answer: the stand-in all
                        // the same (a row a move left there is rarer than
                        // an insert still to come).
                        c.failed.get_or_insert(err);
                        unstarted.push(child);
                    }
                }
            }
            match children_elsewhere::stand_ins(shards.get(at), &unstarted).await {
                Ok(skipped) => c.left_out += skipped,
                Err(err) => {
                    c.failed.get_or_insert(err);
                }
            }
            let next = match children::unfinished(shards.get(at), &level).await {
                Ok(next) => next,
                Err(err) => {
                    c.failed.get_or_insert(err);
                    continue;
                }
            };
            let mut went_on = Vec::with_capacity(next.len());
            for child in next {
                // `None` from its cancel: it finished since the read.
                if c.cancel(shards.get(at), child).await == Some(true) {
                    went_on.push(child);
                }
            }
            levels.push((at, went_on));
        }
    }
    c.settle(shards).await
}

/// A cascade's running state: what it changed, the debts of the children
/// it cancelled (each owes its own children a cascade, which this one
/// runs too), what it left out, and its first failure.
#[derive(Default)]
struct Cascade {
    changed: u64,
    debts: Vec<(usize, JobId, i64)>,
    /// Every child it cancelled (or asked to): met again (found both
    /// where its key routes and where it runs), it is not cancelled or
    /// gone through twice.
    reached: HashSet<JobId>,
    left_out: u64,
    failed: Option<ShardError>,
}

impl Cascade {
    /// Cancels `child` on `shard`: `Some(true)` when it did (or asked
    /// it), `Some(false)` when the shard holds it in no state to cancel
    /// or this cascade reached it already, `None` when the shard failed.
    async fn cancel(&mut self, shard: &Shard, child: JobId) -> Option<bool> {
        if self.reached.contains(&child) {
            return Some(false);
        }
        match super::jobs::cancel_owing(shard, child).await {
            Ok(Some(done)) => {
                self.changed += 1;
                self.reached.insert(child);
                self.debts.push((shard.index, child, done.owed));
                Some(true)
            }
            Ok(None) => Some(false),
            Err(err) => {
                self.failed.get_or_insert(err);
                None
            }
        }
    }

    /// The cascade's answer. When it reached every child, it pays the
    /// debts the children it cancelled wrote: it went through their own
    /// children too.
    async fn settle(mut self, shards: &ShardSet) -> Result<Cascaded, ShardError> {
        if self.failed.is_none() && self.left_out == 0 {
            let mut debts = std::mem::take(&mut self.debts);
            debts.sort_by_key(|(on, _, _)| *on);
            for on in debts
                .iter()
                .map(|(on, _, _)| *on)
                .collect::<std::collections::BTreeSet<_>>()
            {
                let here: Vec<(JobId, i64)> = debts
                    .iter()
                    .filter(|d| d.0 == on)
                    .map(|d| (d.1, d.2))
                    .collect();
                if let Err(err) = super::cascade_debts::paid(shards.get(on), &here).await {
                    self.failed.get_or_insert(err);
                }
            }
        }
        match self.failed {
            Some(err) => Err(err),
            None => Ok(Cascaded {
                changed: self.changed,
                complete: self.left_out == 0,
            }),
        }
    }
}

/// What a cancel cascade did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cascaded {
    /// The descendants it cancelled or asked to cancel.
    pub changed: u64,
    /// Whether it reached every child: false when a child's stand-in was
    /// left out (its range is moving, or the map is stale here), or a
    /// started child was on no shard this process knows.
    pub complete: bool,
}

/// The shard other than `at` that holds a row with `child`'s id: an
/// unstarted child its parent's run inserted before a move of its key's
/// range left it there (a move copies unclaimed jobs only; its stand-in
/// would be a second row, read as the child), or a running child whose
/// range moved to `at` (`at` holds its stand-in only). It is cancelled
/// where it is. Asks each other shard once.
async fn held_elsewhere(
    shards: &ShardSet,
    at: usize,
    child: JobId,
) -> Result<Option<usize>, ShardError> {
    for shard in shards.all() {
        if shard.index != at && super::jobs::exists(shard, child).await? {
            return Ok(Some(shard.index));
        }
    }
    Ok(None)
}

/// Those of `children` (started, their key routed to `shard`) that run,
/// or sit, on another shard: `shard` has no row of them while their range
/// moves or is not `shard`'s ([`super::sql::CASCADE_CHILDREN_AWAY`]). One
/// statement.
async fn away_from(shard: &Shard, children: &[JobId]) -> Result<Vec<JobId>, ShardError> {
    if children.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<i32> = children.iter().map(|c| c.shard_key).collect();
    let ids: Vec<i64> = children.iter().map(|c| c.id).collect();
    let params: [super::sql::Param; 2] = [(&keys, Type::INT4_ARRAY), (&ids, Type::INT8_ARRAY)];
    let away = super::exec::query(shard, super::sql::CASCADE_CHILDREN_AWAY, &params).await?;
    Ok(away
        .iter()
        .map(|r| JobId {
            shard_key: r.get("shard_key"),
            id: r.get("id"),
        })
        .collect())
}
