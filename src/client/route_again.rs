//! Routing an enqueue's refused jobs again after a shard said the map they
//! were routed by is old (SQLSTATE SQ004, `shardq_check_route`).
//!
//! The refusing statement wrote nothing (the epoch check runs first, in the
//! same statement as the insert), but a part's earlier statements may have
//! (another chunk, a deduplicated job before it, a try whose reply was
//! lost): so the refused parts' jobs found on their shard under their
//! reserved ids, with their content (queue, handler, payload, ordering
//! key), are kept as written, and so are those found the same way where
//! the reloaded map routes their shard key now (a move copied them there,
//! ids kept, and removed them from the shard they were written on: the
//! copy is written before the removal, so a job missing from the first
//! shard is on the second); only the others are routed by the reloaded map
//! and given new ids on their (maybe new) shards; their old ids are
//! harmless gaps. Parts not refused stay as they are. The content
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
use crate::shard_map::ShardMap;
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
        let moved = self.find_moved(pending, &stale, &present, &map).await?;
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
            let (elsewhere, unwritten): (Vec<Reserved>, Vec<Reserved>) = unwritten
                .into_iter()
                .partition(|r| moved.contains(&r.job_id()));
            // Written already, here or (moved since) where the map routes
            // them now: kept in the call for `enqueue_again`, which skips
            // them.
            for (at, found) in [(shard_index, kept)]
                .into_iter()
                .chain(by_shard(elsewhere, &map))
            {
                written.extend(found.iter().map(|r| (r.index, r.job_id())));
                if !found.is_empty() {
                    pending.parts.push((at, found));
                }
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

impl Client {
    /// The jobs of the `stale` parts not found on their own shard
    /// (`present`, by part) that are where `map` routes their shard key now,
    /// under their reserved id with their content: an earlier try wrote
    /// them (its reply lost), then a move copied them there and removed
    /// them from the shard they were written on. Writing them again would
    /// run them twice.
    async fn find_moved(
        &self,
        pending: &PendingEnqueue,
        stale: &[(usize, ShardError)],
        present: &[HashSet<i64>],
        map: &ShardMap,
    ) -> Result<HashSet<JobId>, ClientError> {
        let mut missing: Vec<&Reserved> = Vec::new();
        for ((p, _), present) in stale.iter().zip(present) {
            let (shard_index, part) = &pending.parts[*p];
            missing.extend(part.iter().filter(|r| {
                !present.contains(&r.id) && map.shard_for(r.shard_key) != *shard_index
            }));
        }
        let mut found = HashSet::new();
        for (at, jobs) in by_shard(missing, map) {
            let ids: Vec<(JobId, &crate::job::NewJob)> =
                jobs.iter().map(|r| (r.job_id(), &r.job)).collect();
            match jobs::present(self.shards.get(at), &ids).await {
                Ok(ids) => found.extend(
                    jobs.iter()
                        .filter(|r| ids.contains(&r.id))
                        .map(|r| r.job_id()),
                ),
                Err(source) => {
                    return Err(ClientError::OutcomeUnknown {
                        pending: Box::new(pending.clone()),
                        source,
                    })
                }
            }
        }
        Ok(found)
    }
}

/// `jobs` grouped by the shard `map` routes each one's shard key to.
fn by_shard<R: std::borrow::Borrow<Reserved>>(
    jobs: Vec<R>,
    map: &ShardMap,
) -> Vec<(usize, Vec<R>)> {
    let mut out: Vec<(usize, Vec<R>)> = Vec::new();
    for job in jobs {
        let at = map.shard_for(job.borrow().shard_key);
        match out.iter_mut().find(|(shard, _)| *shard == at) {
            Some((_, group)) => group.push(job),
            None => out.push((at, vec![job])),
        }
    }
    out
}
