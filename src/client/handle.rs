//! The client handle: the shards and limits it enqueues under, and the
//! enqueue and read calls its sibling files do not add.

use super::error::ClientError;
use crate::config::Config;
use crate::job::EnqueueLimits;
use crate::job::{JobId, NewJob};
use crate::router;
use crate::shard_map::ShardMap;
use crate::shards::{ShardError, ShardSet};
use crate::store::jobs::NewRow;

/// Enqueues jobs and reads queue state. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    pub(super) shards: ShardSet,
    pub(super) limits: EnqueueLimits,
}

impl Client {
    /// A client over the shards of `config`.
    ///
    /// # Errors
    ///
    /// When a pool cannot be built.
    pub fn new(config: &Config) -> Result<Client, ShardError> {
        Ok(Client::from_shards(
            ShardSet::connect(config)?,
            config.limits.clone(),
        ))
    }

    /// A client over existing pools.
    pub fn from_shards(shards: ShardSet, limits: EnqueueLimits) -> Client {
        Client { shards, limits }
    }

    /// The shards.
    pub fn shards(&self) -> &ShardSet {
        &self.shards
    }

    /// Enqueues one job.
    ///
    /// # Errors
    ///
    /// As [`Client::enqueue_many`].
    ///
    /// # Cancel safety
    ///
    /// As [`Client::enqueue_many`].
    pub async fn enqueue(&self, job: NewJob) -> Result<JobId, ClientError> {
        Ok(self.enqueue_many(vec![job]).await?[0])
    }

    /// Enqueues jobs, shards in parallel: per shard one statement that takes
    /// the jobs' ids, then one insert per 5,000 jobs (and one per job with a
    /// deduplication id). Returns the ids in input order; a key's jobs get
    /// ascending ids in input order.
    ///
    /// Exactly once, even when a reply is lost: the jobs are written under
    /// the ids taken first, and a row whose id exists is skipped, so a
    /// failed insert is retried (a few times, within seconds) without
    /// writing anything twice.
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] (nothing written) for a bad name or payload;
    /// [`ClientError::Shard`] with a transient error when ids could not be
    /// taken (nothing written: call again); [`ClientError::OutcomeUnknown`]
    /// when a shard did not confirm its insert after retries (call
    /// [`Client::enqueue_again`] with it); [`ClientError::Shard`] with a
    /// permanent error (bad data; other shards' jobs may be written),
    /// [`ClientError::Duplicate`] and [`ClientError::DedupContended`] as
    /// documented there.
    ///
    /// # Retrying a batch whose reply was lost
    ///
    /// Do not call `enqueue_many` again with the same jobs after
    /// [`ClientError::OutcomeUnknown`]: the jobs written already would be
    /// written twice (unless they have deduplication ids). Pass the error's
    /// `pending` to [`Client::enqueue_again`] instead, as often as it takes;
    /// it writes each job of the batch exactly once, under the id it took
    /// first, and returns all ids in input order. A transient
    /// [`ClientError::Shard`] means nothing was written: calling again is safe.
    ///
    /// ```no_run
    /// # async fn example(client: shardq::Client, jobs: Vec<shardq::NewJob>)
    /// # -> Result<(), shardq::ClientError> {
    /// use shardq::ClientError;
    /// let ids = match client.enqueue_many(jobs).await {
    ///     Err(ClientError::OutcomeUnknown { pending, .. }) => {
    ///         client.enqueue_again(*pending).await? // retry this as needed
    ///     }
    ///     other => other?,
    /// };
    /// # let _ = ids; Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped after an insert was sent, some jobs may be
    /// written, and their ids are lost with the future; give them
    /// deduplication ids to make a new call safe.
    pub async fn enqueue_many(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>, ClientError> {
        let total = jobs.len();
        let map = self.shards.loaded_map().await?;
        for (index, job) in jobs.iter().enumerate() {
            self.validate_job(index, job)?;
        }
        let (per_shard, deduplicated) = self.route_all(jobs.into_iter().enumerate(), &map);
        let pending = self.reserve(total, per_shard, deduplicated, &map).await?;
        self.write(pending, false).await
    }

    /// `job` as a row to write, its attempt limit resolved.
    pub(super) fn row<'j>(&self, shard_key: i32, job: &'j NewJob) -> NewRow<'j> {
        NewRow {
            shard_key,
            job,
            max_attempts: self.max_attempts(job),
        }
    }

    /// Routes `jobs` (position in the call, job) by `map`: those without
    /// deduplication id by shard index, and the others (each written on
    /// its own).
    #[allow(clippy::type_complexity)]
    pub(super) fn route_all(
        &self,
        jobs: impl IntoIterator<Item = (usize, NewJob)>,
        map: &ShardMap,
    ) -> (Vec<Vec<(usize, i32, NewJob)>>, Vec<(usize, i32, NewJob)>) {
        let mut rng = rand::thread_rng();
        let mut per_shard: Vec<Vec<(usize, i32, NewJob)>> = vec![Vec::new(); self.shards.len()];
        let mut deduplicated = Vec::new();
        for (index, job) in jobs {
            let shard_key = match job.routing_key() {
                Some(key) => router::shard_key_for(key),
                None => router::random_shard_key(&mut rng),
            };
            if job.dedup_id.is_some() {
                deduplicated.push((index, shard_key, job));
            } else {
                per_shard[map.shard_for(shard_key)].push((index, shard_key, job));
            }
        }
        (per_shard, deduplicated)
    }

    pub(super) fn max_attempts(&self, job: &NewJob) -> i32 {
        job.max_attempts
            .unwrap_or(self.limits.default_max_attempts)
            .max(1)
    }

    pub(super) fn validate_job(&self, index: usize, job: &NewJob) -> Result<(), ClientError> {
        job.validate(&self.limits)
            .map_err(|reason| ClientError::Invalid { index, reason })
    }
}
