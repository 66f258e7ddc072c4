//! Routing an enqueue's refused jobs again after a shard said the map they
//! were routed by is old (SQLSTATE SQ004, `shardq_check_route`).
//!
//! The refusing statement wrote nothing (the epoch check runs first, in the
//! same statement as the insert), but a part's earlier statements may have
//! (another chunk, a deduplicated job before it, a try whose reply was
//! lost): so the refused parts' jobs found on their shard under their
//! reserved ids, with their content (queue, handler, payload, ordering
//! key), are kept as written, and only the others are routed by the
//! reloaded map and given new ids on their (maybe new) shards; their old
//! ids are harmless gaps. Parts not refused stay as they are. The content
//! matters: a move may have copied to that shard another job under the
//! same id and shard key (each shard numbers its jobs itself), and taking
//! it for this one loses this one.
//!
//! Between the refusal and the lookup, nothing else writes these ids: they
//! were reserved by this call, and only it (or [`Client::enqueue_again`]
//! with its pending enqueue, which the caller runs after this call ends)
//! writes under them.

use super::error::ClientError;
use super::handle::Client;
use super::pending::{PendingEnqueue, Reserved};
use crate::job::JobId;
use crate::shards::ShardError;
use crate::store::jobs;
use std::collections::HashSet;

impl Client {
    /// Reloads the shard map and moves the unwritten jobs of the `stale`
    /// parts of `pending` (part position, the refusal) to parts routed by
    /// it, with new ids, making its epoch `pending`'s. Returns the positions
    /// of the new parts, to write next, and (input position, id) of the
    /// refused parts' jobs found written.
    ///
    /// # Errors
    ///
    /// [`ClientError::OutcomeUnknown`] when a refusing shard cannot say
    /// which jobs it holds (pass it to [`Client::enqueue_again`]);
    /// [`ClientError::Map`] when the map cannot be reloaded;
    /// [`ClientError::Shard`] when new ids cannot be taken. On the last two
    /// nothing of the unwritten jobs is written.
    #[allow(clippy::type_complexity)]
    pub(super) async fn route_again(
        &self,
        pending: &mut PendingEnqueue,
        stale: Vec<(usize, ShardError)>,
    ) -> Result<(Vec<usize>, Vec<(usize, JobId)>), ClientError> {
        let mut present = Vec::with_capacity(stale.len());
        for (p, _) in &stale {
            let (shard_index, part) = &pending.parts[*p];
            let ids: Vec<(JobId, &crate::job::NewJob)> =
                part.iter().map(|r| (r.job_id(), &r.job)).collect();
            match jobs::present(self.shards.get(*shard_index), &ids).await {
                Ok(found) => present.push(found.into_iter().collect::<HashSet<i64>>()),
                Err(source) => {
                    return Err(ClientError::OutcomeUnknown {
                        pending: Box::new(pending.clone()),
                        source,
                    })
                }
            }
        }
        let map = self.shards.load_map().await?;
        tracing::info!(
            epoch = map.epoch(),
            refused_parts = stale.len(),
            "a shard refused an enqueue routed by an old shard map; routing it again"
        );
        let mut positions: Vec<(usize, HashSet<i64>)> =
            stale.iter().map(|(p, _)| *p).zip(present).collect();
        positions.sort_unstable_by_key(|(p, _)| *p);
        let mut refused = Vec::new();
        let mut written = Vec::new();
        // From the back, so the positions before stay valid.
        for (p, present) in positions.into_iter().rev() {
            let (shard_index, part) = pending.parts.remove(p);
            let (kept, unwritten): (Vec<Reserved>, Vec<Reserved>) =
                part.into_iter().partition(|r| present.contains(&r.id));
            written.extend(kept.iter().map(|r| (r.index, r.job_id())));
            if !kept.is_empty() {
                // Written already: kept in the call for `enqueue_again`,
                // which skips them.
                pending.parts.push((shard_index, kept));
            }
            refused.extend(unwritten.into_iter().map(|r| (r.index, r.job)));
        }
        let (per_shard, deduplicated) = self.route_all(refused, &map);
        let rerouted = self
            .reserve(pending.total, per_shard, deduplicated, &map)
            .await?;
        let first_new = pending.parts.len();
        pending.parts.extend(rerouted.parts);
        pending.epoch = rerouted.epoch;
        Ok(((first_new..pending.parts.len()).collect(), written))
    }
}
