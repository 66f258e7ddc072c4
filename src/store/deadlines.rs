//! Workflow deadlines (`NewJob::timeout`): the pass that ends the workflows
//! past theirs ([`sql::JOB_FIND_PAST_DEADLINE`], then
//! [`sql::JOB_END_PAST_DEADLINE`] under the key locks it gets), run by the
//! promoter on every shard. Its module in `sql` lists the writers that can
//! run between its statements.

use super::locks;
use super::sql;
use super::upkeep::return_lost_in;
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use tokio_postgres::types::Type;

/// What one deadline pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadlinePass {
    /// The jobs past their deadline it found (locked): as many as its
    /// limit means more may be left.
    pub found: usize,
    /// The jobs it ended (`cancelled`) or whose cancellation it asked
    /// (running): their descendants are cancelled next.
    pub ended: Vec<JobId>,
    /// The generation of the cancel cascades they owe (one for all):
    /// what the cascade that follows pays.
    pub owed: i64,
}

/// Whether any unfinished job on `shard` is past its deadline
/// ([`sql::JOB_ANY_PAST_DEADLINE`]): the pass's cheap first question.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn any_past_deadline(shard: &Shard) -> Result<bool, ShardError> {
    let row = super::exec::query_one(shard, sql::JOB_ANY_PAST_DEADLINE, &[]).await?;
    Ok(row.get("any"))
}

/// Ends up to `limit` jobs on `shard` past their deadline, unless another
/// process is doing it: waiting, scheduled (parked too) and queued ones
/// end `cancelled`, running ones get their cancellation asked. A job whose
/// key lock or row is held now is left for a later pass: one stuck key
/// never stops it.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe: one transaction, committed or not.
pub async fn end_past_deadline(shard: &Shard, limit: i64) -> Result<DeadlinePass, ShardError> {
    shard
        .within(async move {
            let err = |e| shard.query_error(e);
            let mut client = shard.lend().await?;
            let pass = async {
                let tx = client.transaction().await?;
                let gate = tx
                    .query_typed(
                        sql::UPKEEP_GATE_AT,
                        &[
                            (&locks::maintenance_class(), Type::INT4),
                            (&locks::DEADLINE_SLOT, Type::INT4),
                        ],
                    )
                    .await?;
                if !gate.first().is_some_and(|row| row.get::<_, bool>("got")) {
                    return Ok(DeadlinePass::default());
                }
                let found = tx
                    .query_typed(sql::JOB_FIND_PAST_DEADLINE, &[(&limit, Type::INT8)])
                    .await?;
                let rows = return_lost_in(&tx, &found, sql::JOB_END_PAST_DEADLINE, &[]).await?;
                tx.commit().await?;
                Ok(DeadlinePass {
                    found: found.len(),
                    owed: rows.first().map_or(0, |r| r.get("owed")),
                    ended: rows
                        .iter()
                        .map(|r| JobId {
                            shard_key: r.get("shard_key"),
                            id: r.get("id"),
                        })
                        .collect(),
                })
            }
            .await;
            client.settle();
            pass.map_err(err)
        })
        .await
}
