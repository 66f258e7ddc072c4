//! Transactional enqueue: the job is written inside the caller's own
//! transaction on the shard it routes to, so it exists only if that
//! transaction commits.

use super::error::ClientError;
use super::handle::Client;
use crate::job::{InvalidJob, JobId, NewJob};
use crate::router;
use crate::shards::Shard;
use crate::store::floors;
use crate::store::jobs::{self, NewRow};
use tokio_postgres::GenericClient;

/// A job with its route fixed: open your transaction on the database of
/// [`RoutedJob::shard`] (with [`Shard::user_client`], or any connection of
/// your own to it) and write the job with [`RoutedJob::insert`].
#[derive(Debug, Clone)]
pub struct RoutedJob {
    shard: Shard,
    shard_key: i32,
    job: NewJob,
    max_attempts: i32,
    /// The epoch of the map it was routed by; `None` when the client had
    /// not loaded the map (the shard then checks the key by its current one).
    epoch: Option<i32>,
}

impl Client {
    /// Checks `job` and fixes its shard, for [`RoutedJob::insert`] inside your
    /// own transaction. Deduplication ids and debounces are not supported
    /// here (use [`Client::enqueue`]). Routes by the map the client holds: load it
    /// first ([`ShardSet::load_map`](crate::shards::ShardSet::load_map)) for
    /// the insert to be fenced by its epoch.
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] for a bad name or payload, a dedup id or a
    /// debounce.
    pub fn route(&self, job: NewJob) -> Result<RoutedJob, ClientError> {
        self.validate_job(0, &job)?;
        if job.dedup_id.is_some() {
            return Err(ClientError::Invalid {
                index: 0,
                reason: InvalidJob::DedupInTransaction,
            });
        }
        if job.debounce.is_some() {
            return Err(ClientError::Invalid {
                index: 0,
                reason: InvalidJob::DebounceInTransaction,
            });
        }
        let shard_key = match job.routing_key() {
            Some(key) => router::shard_key_for(key),
            None => router::random_shard_key(&mut rand::thread_rng()),
        };
        let routing = self.shards.routing();
        Ok(RoutedJob {
            epoch: routing.loaded().then(|| routing.get().epoch()),
            shard: self.shards.for_key(shard_key).clone(),
            shard_key,
            max_attempts: self.max_attempts(&job),
            job,
        })
    }
}

impl RoutedJob {
    /// The shard whose database the transaction must be on.
    pub fn shard(&self) -> &Shard {
        &self.shard
    }

    /// Writes the job through `tx`, a transaction (or connection) on
    /// [`RoutedJob::shard`]. The job exists only if `tx` commits.
    ///
    /// # Errors
    ///
    /// The statement's error (e.g. the transaction is on a shard without the
    /// schema). SQLSTATE SQ004: the shard's map moved on since the route was
    /// fixed (nothing written): roll back, reload the map
    /// ([`ShardSet::load_map`](crate::shards::ShardSet::load_map)) and route
    /// again; SQ001: the key is not on this shard.
    ///
    /// # Cancel safety
    ///
    /// As the caller's transaction: nothing is kept unless it commits.
    pub async fn insert<C: GenericClient>(&self, tx: &C) -> Result<JobId, tokio_postgres::Error> {
        let row = NewRow {
            shard_key: self.shard_key,
            job: &self.job,
            max_attempts: self.max_attempts,
        };
        // The queue's floors made first, outside `tx`, so that `tx` makes
        // none and holds no other enqueue back; if that fails, the trigger
        // makes them in `tx` as it would for SQL.
        if let Err(err) = floors::ensure(&self.shard, std::iter::once(&self.job)).await {
            tracing::debug!(shard = %self.shard.name, error = %err, "ready floors not made ahead");
        }
        jobs::insert_in(tx, row, self.epoch).await
    }
}
