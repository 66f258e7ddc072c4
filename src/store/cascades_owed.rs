//! The cancel cascades owed (`shardq_cascades_owed`): a cancel and the
//! deadline pass write one per workflow they end, in their own
//! transaction; the workers' pass runs each again once it is due, until a
//! cascade reaches every child. A caller that dies midway through its
//! cascade, a child's shard that did not answer, or a child's range that
//! was moving then, leaves the children to this pass, not running.

use super::cancel_cascade::cancel_descendants;
use super::exec;
use super::sql;
use crate::job::JobId;
use crate::shards::{Shard, ShardError, ShardSet};
use tokio_postgres::types::Type;

/// What a pass over the cascades owed on one shard did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OwedPass {
    /// Cascades taken (due, and not taken by another process).
    pub taken: usize,
    /// Cascades that reached every child: no longer owed.
    pub done: usize,
    /// Descendants they cancelled or asked to cancel.
    pub changed: u64,
}

/// Runs up to `limit` cascades owed on shard `index` whose time has come
/// (the row's lease: a minute, pushed ahead as it is taken), each from
/// wherever its workflow's row is now, and drops those that reached every
/// child. A cascade that fails or leaves a child out stays owed, due again
/// in a minute; the others go on.
///
/// # Errors
///
/// The first [`ShardError`]: of the take (nothing ran), or of a cascade
/// (the others ran).
///
/// # Cancel safety
///
/// Not cancel safe: some cascades may have run; they stay owed until a
/// later pass finishes them.
pub async fn run_due(shards: &ShardSet, index: usize, limit: i64) -> Result<OwedPass, ShardError> {
    let shard = shards.get(index);
    let rows = exec::query(shard, sql::CASCADES_OWED_TAKE, &[(&limit, Type::INT8)]).await?;
    let mut pass = OwedPass {
        taken: rows.len(),
        ..OwedPass::default()
    };
    let mut failed = None;
    for row in rows {
        let parent = JobId {
            shard_key: row.get("shard_key"),
            id: row.get("id"),
        };
        match run_one(shards, index, parent).await {
            Ok(Some(changed)) => {
                pass.changed += changed;
                match paid(shard, &[parent]).await {
                    Ok(()) => pass.done += 1,
                    Err(err) => {
                        failed.get_or_insert(err);
                    }
                }
            }
            Ok(None) => {}
            Err(err) => {
                failed.get_or_insert(err);
            }
        }
    }
    match failed {
        Some(err) => Err(err),
        None => Ok(pass),
    }
}

/// Drops the cascades `parents` owe on `shard` (where they were
/// cancelled): a cascade over all their children reached every child.
///
/// # Errors
///
/// [`ShardError`] when the shard fails: the cascades stay owed, and the
/// pass runs them once more.
///
/// # Cancel safety
///
/// Cancel safe in effect: one statement; a repeat deletes nothing.
pub async fn paid(shard: &Shard, parents: &[JobId]) -> Result<(), ShardError> {
    let keys: Vec<i32> = parents.iter().map(|p| p.shard_key).collect();
    let ids: Vec<i64> = parents.iter().map(|p| p.id).collect();
    let params: [sql::Param; 2] = [(&keys, Type::INT4_ARRAY), (&ids, Type::INT8_ARRAY)];
    exec::execute(shard, sql::CASCADES_OWED_PAID, &params).await?;
    Ok(())
}

/// One owed cascade: from the shard holding `parent`'s row (this one, or
/// another after a move), or none when no shard holds it (its retention
/// ran: nothing is left to read its children from). `Some(changed)` when it
/// reached every child.
async fn run_one(
    shards: &ShardSet,
    index: usize,
    parent: JobId,
) -> Result<Option<u64>, ShardError> {
    let Some(at) = holder(shards, index, parent).await? else {
        return Ok(Some(0));
    };
    let cascaded = cancel_descendants(shards, at, &[parent]).await?;
    Ok(cascaded.complete.then_some(cascaded.changed))
}

/// The shard that holds `parent`'s row: `index` first, where it was
/// cancelled, then the others.
async fn holder(
    shards: &ShardSet,
    index: usize,
    parent: JobId,
) -> Result<Option<usize>, ShardError> {
    if super::jobs::exists(shards.get(index), parent).await? {
        return Ok(Some(index));
    }
    for shard in shards.all() {
        if shard.index != index && super::jobs::exists(shard, parent).await? {
            return Ok(Some(shard.index));
        }
    }
    Ok(None)
}
