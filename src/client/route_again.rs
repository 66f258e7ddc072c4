//! Routing an enqueue's refused jobs again after a shard said the map they
//! were routed by is old (SQLSTATE SQ004, `shardq_check_route`).
//!
//! The refusing statement wrote nothing (the epoch check runs first, in the
//! same statement as the insert), so the refused parts' jobs are routed by
//! the reloaded map and given new ids on their (maybe new) shards; their old
//! ids are harmless gaps. Parts already written stay as they are.
//!
//! Not covered: a refusal met on a retry of an insert whose first try's
//! reply was lost ([`Client::enqueue_again`], or the client's own retries):
//! had that try committed under the old epoch, the job would be written
//! again on its new shard. Resharding (issue 23 §2) must settle such rows
//! before it retires an epoch.

use super::error::ClientError;
use super::handle::Client;
use super::pending::PendingEnqueue;
use crate::shards::ShardError;

impl Client {
    /// Reloads the shard map, moves the jobs of the `stale` parts of
    /// `pending` (part position, the refusal) to parts routed by it, with
    /// new ids, and makes its epoch `pending`'s. Returns the positions of
    /// the new parts, to write next.
    ///
    /// # Errors
    ///
    /// [`ClientError::Map`] when the map cannot be reloaded;
    /// [`ClientError::Shard`] when new ids cannot be taken (nothing of the
    /// refused jobs is written either way).
    pub(super) async fn route_again(
        &self,
        pending: &mut PendingEnqueue,
        stale: Vec<(usize, ShardError)>,
    ) -> Result<Vec<usize>, ClientError> {
        let map = self.shards.load_map().await?;
        tracing::info!(
            epoch = map.epoch(),
            refused_parts = stale.len(),
            "a shard refused an enqueue routed by an old shard map; routing it again"
        );
        let mut positions: Vec<usize> = stale.iter().map(|(p, _)| *p).collect();
        positions.sort_unstable();
        let mut refused = Vec::new();
        // From the back, so the positions before stay valid.
        for p in positions.into_iter().rev() {
            let (_, part) = pending.parts.remove(p);
            refused.extend(part.into_iter().map(|r| (r.index, r.job)));
        }
        let (per_shard, deduplicated) = self.route_all(refused, &map);
        let rerouted = self
            .reserve(pending.total, per_shard, deduplicated, &map)
            .await?;
        let first_new = pending.parts.len();
        pending.parts.extend(rerouted.parts);
        pending.epoch = rerouted.epoch;
        Ok((first_new..pending.parts.len()).collect())
    }
}
