//! The cancel cascade: a cancelled workflow's unfinished children, and
//! theirs, are cancelled too ([`Client::cancel`]).

use super::error::ClientError;
use super::handle::Client;
use crate::job::JobId;
use crate::store::{cancel_cascade, cascade_debts, jobs};

impl Client {
    /// Cancels the unfinished descendants of `parent` (on its shard and
    /// on those where it started children), level by level, but those started with
    /// `ChildPolicy::Abandon` and theirs: each child as [`Client::cancel`]
    /// cancels one job (waiting, scheduled and queued ones end
    /// `cancelled`; a running one gets the request, and its parent's wake
    /// comes with its final status). Returns how many it changed.
    ///
    /// Each child is its own transaction, which locks that child's row
    /// only: never a parent's row while it waits for a child's, so it
    /// cannot deadlock with a child's completion (which holds the child
    /// and only tries its parent's lock). The parent is cancelled first,
    /// so it starts no new child meanwhile (`start_child` is fenced by
    /// its cancel request); a child started before that is found by the
    /// read of the next level or by cancelling again.
    ///
    /// The cancel wrote the cascade as owed (`owed`: on which shard, and
    /// its generation), and this
    /// one, once it reached every child, marks it paid: should it fail,
    /// stop midway or leave a child out (its range moving), the workers
    /// run it again.
    ///
    /// # Errors
    ///
    /// When the shard fails: the children cancelled so far stay cancelled,
    /// and cancelling the parent again goes on with the rest.
    pub(super) async fn cancel_children(
        &self,
        parent: JobId,
        owed: Option<(usize, i64)>,
    ) -> Result<u64, ClientError> {
        let holder = self
            .find(parent, |shard| async move {
                Ok(jobs::exists(shard, parent).await?.then_some(()))
            })
            .await?;
        let Some((shard, ())) = holder else {
            return Ok(0);
        };
        let cascaded =
            cancel_cascade::cancel_descendants(&self.shards, shard.index, &[parent]).await?;
        if let (true, Some((at, generation))) = (cascaded.complete, owed) {
            // Not paid (this role may not, say): the workers' pass runs
            // the cascade once more and pays it.
            let debt = [(parent, generation)];
            if let Err(err) = cascade_debts::paid(self.shards.get(at), &debt).await {
                tracing::warn!(
                    job = %parent,
                    error = %crate::error_chain::error_chain(&err),
                    "cancel cascade done but not marked paid; the workers will run it again"
                );
            }
        }
        Ok(cascaded.changed)
    }
}
