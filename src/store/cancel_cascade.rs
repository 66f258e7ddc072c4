//! The cancel cascade: a cancelled workflow's unfinished children, and
//! theirs, on every shard they live on.

use super::{children, children_elsewhere};
use crate::job::JobId;
use crate::shards::{ShardError, ShardSet};

/// Cancels the unfinished descendants of `parents` (on shard `index`),
/// level by level, on their shard and on the shards where they started
/// children (their `shardq:child:N:id` steps say which), but those
/// started with `ChildPolicy::Abandon` and theirs: each child as
/// [`super::jobs::cancel`] cancels one job, in a transaction of its own
/// that locks that child's row only (never a parent's while it waits for
/// a child's, so it cannot deadlock with a child's completion, which
/// holds the child and only tries its parent's lock). The cascade of
/// `Client::cancel` and of the deadline pass. Returns how many it changed.
///
/// # Errors
///
/// [`ShardError`] when a shard fails: the children cancelled so far stay
/// cancelled; calling again goes on with the rest.
///
/// # Cancel safety
///
/// Not cancel safe: some children may be cancelled; calling again is
/// harmless.
pub async fn cancel_descendants(
    shards: &ShardSet,
    index: usize,
    parents: &[JobId],
) -> Result<u64, ShardError> {
    let mut changed = 0;
    // Parents, by the shard to read their children on.
    let mut levels = vec![(index, parents.to_vec())];
    while let Some((on, level)) = levels.pop() {
        if level.is_empty() {
            continue;
        }
        let mut asked = vec![on];
        asked.extend(children_elsewhere::shards_of_children(shards, on, &level).await?);
        for at in asked {
            let shard = shards.get(at);
            let next = children::unfinished(shard, &level).await?;
            for child in &next {
                if super::jobs::cancel(shard, *child).await?.is_some() {
                    changed += 1;
                }
            }
            levels.push((at, next));
        }
    }
    Ok(changed)
}
