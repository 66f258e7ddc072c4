//! The cancel cascade: a cancelled workflow's unfinished children, and
//! theirs, on every shard they live on.

use super::children;
use super::children_elsewhere::{self, StartedChild};
use crate::job::JobId;
use crate::shards::{Shard, ShardError, ShardSet};

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
/// death, cannot start it after. The cascade of `Client::cancel` and of
/// the deadline pass, and of the pass over the cascades owed
/// ([`super::cascades_owed::run_due`]). Returns how many it changed, and whether it reached
/// every child: not when a stand-in was left out (its key's range is
/// moving, or this process's map is stale), so its cascade stays owed.
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
    let mut changed = 0;
    let mut left_out = 0;
    // One shard failing does not keep the others' children running.
    let mut failed = None;
    // Parents, by the shard to read their children on.
    let mut levels = vec![(index, parents.to_vec())];
    // The descendants whose own children this cascade went on to.
    let mut reached: Vec<(usize, Vec<JobId>)> = Vec::new();
    while let Some((on, level)) = levels.pop() {
        if level.is_empty() {
            continue;
        }
        if on != index || level != parents {
            reached.push((on, level.clone()));
        }
        let elsewhere = match children_elsewhere::children_started(shards, on, &level).await {
            Ok(children) => children,
            Err(err) => {
                failed.get_or_insert(err);
                Vec::new()
            }
        };
        let mut asked: Vec<usize> = elsewhere.iter().map(|c| c.shard).collect();
        asked.push(on);
        asked.sort_unstable();
        asked.dedup();
        for at in asked {
            let mut unstarted: Vec<&StartedChild> = Vec::new();
            for child in elsewhere.iter().filter(|c| c.shard == at && !c.started) {
                match left_behind(shards, child).await {
                    Ok(None) => unstarted.push(child),
                    Ok(Some(there)) => {
                        match super::jobs::cancel(shards.get(there), child.id).await {
                            Ok(done) => changed += u64::from(done.is_some()),
                            Err(err) => {
                                failed.get_or_insert(err);
                            }
                        }
                        // Its own children are next, where it is.
                        levels.push((there, vec![child.id]));
                    }
                    Err(err) => {
                        // A shard that does not answer: the stand-in all
                        // the same (a row a move left there is rarer than
                        // an insert still to come).
                        failed.get_or_insert(err);
                        unstarted.push(child);
                    }
                }
            }
            match children_elsewhere::stand_ins(shards.get(at), &unstarted).await {
                Ok(skipped) => left_out += skipped,
                Err(err) => {
                    failed.get_or_insert(err);
                }
            }
            match cancel_children_on(shards.get(at), &level).await {
                Ok((cancelled, next)) => {
                    changed += cancelled;
                    levels.push((at, next));
                }
                Err(err) => {
                    failed.get_or_insert(err);
                }
            }
        }
    }
    let complete = failed.is_none() && left_out == 0;
    if complete {
        // Each child's cancel wrote the cascade it owes its own children:
        // this one went through them all.
        for (on, level) in &reached {
            if let Err(err) = super::cascades_owed::paid(shards.get(*on), level).await {
                failed.get_or_insert(err);
            }
        }
    }
    match failed {
        Some(err) => Err(err),
        None => Ok(Cascaded {
            changed,
            complete: left_out == 0,
        }),
    }
}

/// What a cancel cascade did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cascaded {
    /// The descendants it cancelled or asked to cancel.
    pub changed: u64,
    /// Whether it reached every child: false when a child's stand-in was
    /// left out (its range is moving, or the map is stale here).
    pub complete: bool,
}

/// The shard, other than the one its key routes to, that holds a row with
/// unstarted child `child`'s id: its parent's run inserted it, then a move
/// of its key's range left it there (a move copies unclaimed jobs only).
/// Its stand-in would be a second row, read as the child; it is cancelled
/// where it is instead. Asks each other shard once, for unstarted children
/// only (a run that died, or is still between its insert and its record).
async fn left_behind(shards: &ShardSet, child: &StartedChild) -> Result<Option<usize>, ShardError> {
    for shard in shards.all() {
        if shard.index != child.shard && super::jobs::exists(shard, child.id).await? {
            return Ok(Some(shard.index));
        }
    }
    Ok(None)
}

/// Cancels the unfinished children of `parents` on `shard` (but abandoned
/// ones): how many it changed, and the children, whose own children are
/// next.
async fn cancel_children_on(
    shard: &Shard,
    parents: &[JobId],
) -> Result<(u64, Vec<JobId>), ShardError> {
    let next = children::unfinished(shard, parents).await?;
    let mut changed = 0;
    for child in &next {
        if super::jobs::cancel(shard, *child).await?.is_some() {
            changed += 1;
        }
    }
    Ok((changed, next))
}
