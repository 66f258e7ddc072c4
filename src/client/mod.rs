//! The client: enqueue jobs, read and change them.

mod inspect;
mod transactional;

pub use inspect::{JobInfo, JobOutcome, QueueCount, ShardStatus};
pub use transactional::RoutedJob;

use crate::config::{Config, Limits};
use crate::job::{JobId, NewJob, OnDuplicate};
use crate::router;
use crate::shards::{ShardError, ShardSet};
use crate::sql;
use futures_util::future::try_join_all;
use serde_json::Value;
use tokio_postgres::types::Type;

/// Attempts at inserting a deduplicated job while the holder of its id finishes.
const DEDUP_RACE_RETRIES: usize = 3;

/// Rows per insert statement: large enough to amortise the round trip, small
/// enough to keep one statement's parameters modest.
const INSERT_CHUNK: usize = 5_000;

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
        reason: String,
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
        let shard = self.shards.get(shard_index);
        shard
            .within(async move {
                let client = shard.client().await?;
                let mut out = Vec::with_capacity(part.len());
                for chunk in part.chunks(INSERT_CHUNK) {
                    let keys: Vec<i32> = chunk.iter().map(|(_, k, _)| *k).collect();
                    let queues: Vec<&str> =
                        chunk.iter().map(|(_, _, j)| j.queue.as_str()).collect();
                    let handlers: Vec<&str> =
                        chunk.iter().map(|(_, _, j)| j.handler.as_str()).collect();
                    let ordering: Vec<Option<&str>> = chunk
                        .iter()
                        .map(|(_, _, j)| j.ordering_key.as_deref())
                        .collect();
                    let priorities: Vec<i32> = chunk.iter().map(|(_, _, j)| j.priority).collect();
                    let payloads: Vec<&Value> = chunk.iter().map(|(_, _, j)| &j.payload).collect();
                    let delays: Vec<i64> = chunk
                        .iter()
                        .map(|(_, _, j)| j.delay.as_millis() as i64)
                        .collect();
                    let attempts: Vec<i32> =
                        chunk.iter().map(|(_, _, j)| self.max_attempts(j)).collect();
                    let rows = client
                        .query_typed(
                            sql::JOB_INSERT_MANY,
                            &[
                                (&keys, Type::INT4_ARRAY),
                                (&queues, Type::TEXT_ARRAY),
                                (&handlers, Type::TEXT_ARRAY),
                                (&ordering, Type::TEXT_ARRAY),
                                (&priorities, Type::INT4_ARRAY),
                                (&payloads, Type::JSONB_ARRAY),
                                (&delays, Type::INT8_ARRAY),
                                (&attempts, Type::INT4_ARRAY),
                            ],
                        )
                        .await
                        .map_err(|e| shard.query_error(e))?;
                    for ((index, shard_key, _), row) in chunk.iter().zip(rows) {
                        out.push((
                            *index,
                            JobId {
                                shard_key: *shard_key,
                                id: row.get(0),
                            },
                        ));
                    }
                }
                Ok(out)
            })
            .await
    }

    /// Checks every job and splits them: per shard for the batched insert, and
    /// the deduplicated ones (inserted one by one). Nothing is written on error.
    #[allow(clippy::type_complexity)]
    fn route_all(
        &self,
        jobs: Vec<NewJob>,
    ) -> Result<(Vec<Vec<(usize, i32, NewJob)>>, Vec<(usize, i32, NewJob)>), ClientError> {
        let mut rng = rand::thread_rng();
        let mut per_shard: Vec<Vec<(usize, i32, NewJob)>> = vec![Vec::new(); self.shards.len()];
        let mut deduplicated = Vec::new();
        for (index, job) in jobs.into_iter().enumerate() {
            self.check(index, &job)?;
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
        shard
            .within(async move {
                let client = shard.client().await?;
                let dedup_id = job.dedup_id.as_deref().unwrap_or_default();
                for _ in 0..DEDUP_RACE_RETRIES {
                    let (delay_ms, max_attempts) =
                        (job.delay.as_millis() as i64, self.max_attempts(job));
                    let inserted = client
                        .query_typed_opt(
                            sql::JOB_INSERT_DEDUP,
                            &[
                                (&shard_key, Type::INT4),
                                (&job.queue, Type::TEXT),
                                (&job.handler, Type::TEXT),
                                (&job.ordering_key, Type::TEXT),
                                (&job.priority, Type::INT4),
                                (&job.payload, Type::JSONB),
                                (&delay_ms, Type::INT8),
                                (&max_attempts, Type::INT4),
                                (&dedup_id, Type::TEXT),
                            ],
                        )
                        .await
                        .map_err(|e| shard.query_error(e))?;
                    if let Some(row) = inserted {
                        return Ok(JobId {
                            shard_key,
                            id: row.get(0),
                        });
                    }
                    let existing = client
                        .query_typed_opt(
                            sql::JOB_FIND_DEDUP,
                            &[(&job.queue, Type::TEXT), (&dedup_id, Type::TEXT)],
                        )
                        .await
                        .map_err(|e| shard.query_error(e))?;
                    if let Some(row) = existing {
                        let id = JobId {
                            shard_key: row.get(0),
                            id: row.get(1),
                        };
                        return match job.on_duplicate {
                            OnDuplicate::ReturnExisting => Ok(id),
                            OnDuplicate::Error => Err(ClientError::Duplicate {
                                index,
                                dedup_id: dedup_id.to_string(),
                                existing: id,
                            }),
                        };
                    }
                }
                Err(ClientError::Invalid {
                    index,
                    reason: format!("deduplication id `{dedup_id}` kept changing hands; try again"),
                })
            })
            .await
    }

    /// Rejects what PostgreSQL would refuse or what exceeds the limits, before
    /// anything is written.
    fn check(&self, index: usize, job: &NewJob) -> Result<(), ClientError> {
        job.validate(&self.limits)
            .map_err(|reason| ClientError::Invalid { index, reason })
    }
}
