//! The cancel cascades owed (`shardq_cascades_owed`): a cancel and the
//! deadline pass write one per workflow they end, in their own
//! transaction; the workers' pass runs each again once it is due, until a
//! cascade reaches every child. A caller that dies midway through its
//! cascade, a child's shard that did not answer, or a child's range that
//! was moving then, leaves the children to this pass, not running.
//!
//! Each debt has a generation, greater for a later cancel of the same
//! workflow (cancelled again after a retry): a cascade pays the
//! generation it read before it started, never a later cancel's.

use super::cancel_cascade::cancel_descendants;
use super::cascade_debts::paid;
use super::exec;
use super::sql;
use crate::job::JobId;
use crate::shards::{ShardError, ShardSet};
use std::time::{Duration, Instant};
use tokio_postgres::types::Type;

/// How long a pass keeps taking cascades: half the 30 s a taken
/// cascade's row is leased for, so the rows it took are run before
/// another process may take them again.
const PASS_TIME: Duration = Duration::from_secs(15);

/// What a pass over the cascades owed on one shard did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OwedPass {
    /// Cascades taken (due, and not taken by another process).
    pub taken: usize,
    /// Debts paid: a cascade reached every child, or the workflow is no
    /// longer cancelled (a retry put it back).
    pub done: usize,
    /// Descendants the cascades cancelled or asked to cancel.
    pub changed: u64,
}

/// Runs the cascades owed on shard `index` whose time has come, `limit`
/// taken at a time (each row leased for 30 s, pushed ahead as it is
/// taken) for at most [`PASS_TIME`], each from wherever its workflow's row
/// is now, and pays those that reached every child. A cascade that fails
/// or leaves a child out stays owed, due again in 30 s; the others go
/// on.
///
/// # Errors
///
/// The first [`ShardError`]: of a take (what it took before ran), or of a
/// cascade (the others ran).
///
/// # Cancel safety
///
/// Not cancel safe: some cascades may have run; they stay owed until a
/// later pass finishes them.
pub async fn run_due(shards: &ShardSet, index: usize, limit: i64) -> Result<OwedPass, ShardError> {
    let shard = shards.get(index);
    let started = Instant::now();
    let mut pass = OwedPass::default();
    let mut failed = None;
    loop {
        let rows = exec::query(shard, sql::CASCADES_OWED_TAKE, &[(&limit, Type::INT8)]).await?;
        pass.taken += rows.len();
        let full = rows.len() as i64 >= limit;
        for row in rows {
            let parent = JobId {
                shard_key: row.get("shard_key"),
                id: row.get("id"),
            };
            let generation: i64 = row.get("generation");
            match run_one(shards, index, parent).await {
                Ok(Some(changed)) => match paid(shard, &[(parent, generation)]).await {
                    Ok(()) => {
                        pass.done += 1;
                        pass.changed += changed;
                    }
                    Err(err) => {
                        failed.get_or_insert(err);
                    }
                },
                Ok(None) => {}
                Err(err) => {
                    failed.get_or_insert(err);
                }
            }
        }
        if !full || started.elapsed() >= PASS_TIME {
            break;
        }
    }
    match failed {
        Some(err) => Err(err),
        None => Ok(pass),
    }
}

/// One owed cascade: from the shard holding `parent`'s row (this one, or
/// another after a move). `Some(changed)` when the debt is settled: the
/// cascade reached every child, or `parent` is no longer cancelled (a
/// retry put it back: its children are its own again), or no shard holds
/// it (retention removed it).
async fn run_one(
    shards: &ShardSet,
    index: usize,
    parent: JobId,
) -> Result<Option<u64>, ShardError> {
    match holder(shards, index, parent).await? {
        None | Some((_, false)) => Ok(Some(0)),
        Some((at, true)) => {
            let cascaded = cancel_descendants(shards, at, &[parent]).await?;
            Ok(cascaded.complete.then_some(cascaded.changed))
        }
    }
}

/// The shard that holds `parent`'s row (`index` first, where it was
/// cancelled, then the others), and whether it is cancelled there.
async fn holder(
    shards: &ShardSet,
    index: usize,
    parent: JobId,
) -> Result<Option<(usize, bool)>, ShardError> {
    let first = shards.get(index);
    let others = shards.all().iter().filter(|s| s.index != index);
    for shard in std::iter::once(first).chain(others) {
        let params: [sql::Param; 2] = [(&parent.shard_key, Type::INT4), (&parent.id, Type::INT8)];
        if let Some(row) = exec::query_opt(shard, sql::CASCADE_PARENT_CANCELLED, &params).await? {
            return Ok(Some((shard.index, row.get("cancelled"))));
        }
    }
    Ok(None)
}
