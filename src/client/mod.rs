//! The client: enqueue jobs, read and change them.

mod browse;
mod check;
mod inspect;
mod pause;
mod schedule_status;
mod transactional;

pub use crate::store::browse::{JobFilter, JobSummary, ListState, Position, StepInfo};
pub use crate::store::check::{Example, Finding, Invariant};
pub use crate::store::jobs::JobInfo;
pub use crate::store::queues::{Connections, QueueCount};
pub use crate::store::workers::WorkerRow;
pub use browse::{
    JobDetail, JobList, JobQuery, OverviewOptions, PageCursor, QueueOverview, ShardOverview,
};
pub use check::{
    CheckOptions, CheckReport, ShardCheck, DEFAULT_COUNT_UP_TO, DEFAULT_DEADLINE, DEFAULT_EXAMPLES,
    DEFAULT_KEY_ENTRIES, DEFAULT_STATE_ROWS, STALE_MARGIN,
};
pub use inspect::{JobOutcome, ShardStatus};
pub use pause::PausedQueue;
pub use schedule_status::ScheduleStatus;
pub use transactional::RoutedJob;

use crate::config::{Config, Limits};
use crate::job::{InvalidJob, JobId, NewJob, OnDuplicate};
use crate::router;
use crate::shards::{ShardError, ShardSet};
use crate::store::jobs::{self, NewRow};
use futures_util::future::try_join_all;

/// Attempts at inserting a deduplicated job while the holder of its id finishes.
const DEDUP_RACE_RETRIES: usize = 3;

/// Errors from enqueueing or reading jobs.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A shard failed.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// A job with [`OnDuplicate::Error`] whose deduplication id is taken.
    #[error("job {index}: deduplication id `{dedup_id}` is taken by unfinished job {existing}")]
    Duplicate {
        /// Position in the batch.
        index: usize,
        /// The id.
        dedup_id: String,
        /// The job holding it.
        existing: JobId,
    },
    /// `retry` of a job whose deduplication id an unfinished job holds now.
    #[error(
        "job {0} cannot be retried: another unfinished job of its queue has the same \
         deduplication id; retry it once that job has finished, or enqueue a new job"
    )]
    RetryDuplicate(JobId),
    /// No job has this id.
    #[error("no job {0}")]
    NotFound(JobId),
    /// `result` waited longer than asked.
    #[error("job {0} did not finish within {1:?}")]
    Timeout(JobId, std::time::Duration),
    /// A job was rejected before anything was written.
    #[error("job {index} rejected: {reason}")]
    Invalid {
        /// Position in the batch.
        index: usize,
        /// What is wrong and what to do.
        reason: InvalidJob,
    },
    /// A pause or resume that some shards did not make (the others did;
    /// running it again is harmless).
    #[error(
        "{action} of queue `{queue}` did not reach every shard: {}; the other shards made \
         the change: run it again once these answer",
        failed.join("; ")
    )]
    NotEveryShard {
        /// `pause` or `resume`.
        action: &'static str,
        /// The queue.
        queue: String,
        /// Each shard that failed, with its error.
        failed: Vec<String>,
    },
    /// A deduplicated enqueue kept racing with jobs that took and released
    /// its id; nothing was written.
    #[error("job {index}: deduplication id `{dedup_id}` kept changing hands; try again")]
    DedupContended {
        /// Position in the batch.
        index: usize,
        /// The id.
        dedup_id: String,
    },
}

/// Enqueues jobs and reads queue state. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    shards: ShardSet,
    limits: Limits,
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
    pub fn from_shards(shards: ShardSet, limits: Limits) -> Client {
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
    /// Not cancel safe: dropped after the statement was sent, the job may be
    /// written; give it a deduplication id to make a retry safe.
    pub async fn enqueue(&self, job: NewJob) -> Result<JobId, ClientError> {
        Ok(self.enqueue_many(vec![job]).await?[0])
    }

    /// Enqueues jobs, one statement per shard (per 5,000 jobs), shards in
    /// parallel. Returns the ids in input order.
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] (nothing written) for a bad name or payload;
    /// [`ClientError::Shard`] when a shard fails (parts on other shards may
    /// have been written; their ids are lost to the caller).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped after a statement was sent, some jobs may be
    /// written; give them deduplication ids to make a retry safe.
    pub async fn enqueue_many(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>, ClientError> {
        let total = jobs.len();
        let (per_shard, deduplicated) = self.route_all(jobs)?;
        let writes = per_shard
            .iter()
            .enumerate()
            .filter(|(_, part)| !part.is_empty())
            .map(|(shard, part)| self.insert_on_shard(shard, part));
        let mut ids = vec![
            JobId {
                shard_key: 0,
                id: 0
            };
            total
        ];
        for part in try_join_all(writes).await? {
            for (index, id) in part {
                ids[index] = id;
            }
        }
        // Deduplicated jobs go one statement each: the insert may be skipped.
        for (index, shard_key, job) in deduplicated {
            ids[index] = self.insert_deduplicated(index, shard_key, &job).await?;
        }
        Ok(ids)
    }

    async fn insert_on_shard(
        &self,
        shard_index: usize,
        part: &[(usize, i32, NewJob)],
    ) -> Result<Vec<(usize, JobId)>, ClientError> {
        let rows: Vec<NewRow> = part
            .iter()
            .map(|(_, shard_key, job)| self.row(*shard_key, job))
            .collect();
        let ids = jobs::insert_many(self.shards.get(shard_index), &rows).await?;
        Ok(part.iter().map(|(index, _, _)| *index).zip(ids).collect())
    }

    /// `job` as a row to write, its attempt limit resolved.
    fn row<'j>(&self, shard_key: i32, job: &'j NewJob) -> NewRow<'j> {
        NewRow {
            shard_key,
            job,
            max_attempts: self.max_attempts(job),
        }
    }

    #[allow(clippy::type_complexity)]
    fn route_all(
        &self,
        jobs: Vec<NewJob>,
    ) -> Result<(Vec<Vec<(usize, i32, NewJob)>>, Vec<(usize, i32, NewJob)>), ClientError> {
        let mut rng = rand::thread_rng();
        let mut per_shard: Vec<Vec<(usize, i32, NewJob)>> = vec![Vec::new(); self.shards.len()];
        let mut deduplicated = Vec::new();
        for (index, job) in jobs.into_iter().enumerate() {
            self.validate_job(index, &job)?;
            let shard_key = match job.routing_key() {
                Some(key) => router::shard_key_for(key),
                None => router::random_shard_key(&mut rng),
            };
            if job.dedup_id.is_some() {
                deduplicated.push((index, shard_key, job));
            } else {
                per_shard[router::shard_index(shard_key, self.shards.len())]
                    .push((index, shard_key, job));
            }
        }
        Ok((per_shard, deduplicated))
    }

    fn max_attempts(&self, job: &NewJob) -> i32 {
        job.max_attempts
            .unwrap_or(self.limits.default_max_attempts)
            .max(1)
    }

    /// Inserts a job with a deduplication id, or finds the unfinished job that
    /// holds it. Retries when that job finishes between the two statements.
    async fn insert_deduplicated(
        &self,
        index: usize,
        shard_key: i32,
        job: &NewJob,
    ) -> Result<JobId, ClientError> {
        let shard = self.shards.for_key(shard_key);
        let dedup_id = job.dedup_id.as_deref().unwrap_or_default();
        // Between a skipped insert and the lookup, the holder may finish:
        // then try the insert again.
        for _ in 0..DEDUP_RACE_RETRIES {
            if let Some(id) = jobs::insert_dedup(shard, self.row(shard_key, job), dedup_id).await? {
                return Ok(id);
            }
            if let Some(existing) = jobs::find_dedup(shard, &job.queue, dedup_id).await? {
                return match job.on_duplicate {
                    OnDuplicate::ReturnExisting => Ok(existing),
                    OnDuplicate::Error => Err(ClientError::Duplicate {
                        index,
                        dedup_id: dedup_id.to_string(),
                        existing,
                    }),
                };
            }
        }
        Err(ClientError::DedupContended {
            index,
            dedup_id: dedup_id.to_string(),
        })
    }

    fn validate_job(&self, index: usize, job: &NewJob) -> Result<(), ClientError> {
        job.validate(&self.limits)
            .map_err(|reason| ClientError::Invalid { index, reason })
    }
}
