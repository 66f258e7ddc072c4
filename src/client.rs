//! The client: enqueue jobs and read queue state.

use crate::config::{Config, Limits};
use crate::job::{JobId, NewJob};
use crate::router;
use crate::shards::{ShardError, ShardSet};
use crate::sql;
use futures_util::future::try_join_all;
use serde_json::Value;

/// Rows per insert statement: large enough to amortise the round trip, small
/// enough to keep one statement's parameters modest.
const INSERT_CHUNK: usize = 5_000;

/// Errors from enqueueing or reading jobs.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A shard failed.
    #[error(transparent)]
    Shard(#[from] ShardError),
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

/// One queue/status count on one shard.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueueCount {
    /// Queue.
    pub queue: String,
    /// Status.
    pub status: String,
    /// Jobs.
    pub count: i64,
}

/// What `status` reports for one shard.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShardStatus {
    /// Shard name.
    pub shard: String,
    /// host:port/dbname.
    pub target: String,
    /// Counts, when the shard answered.
    pub counts: Option<Vec<QueueCount>>,
    /// Why it did not answer.
    pub error: Option<String>,
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
        let mut rng = rand::thread_rng();
        let mut per_shard: Vec<Vec<(usize, i32, NewJob)>> = vec![Vec::new(); self.shards.len()];
        for (index, job) in jobs.into_iter().enumerate() {
            self.check(index, &job)?;
            let shard_key = match &job.ordering_key {
                Some(key) => router::shard_key_for(key),
                None => router::random_shard_key(&mut rng),
            };
            per_shard[router::shard_index(shard_key, self.shards.len())]
                .push((index, shard_key, job));
        }
        let total = per_shard.iter().map(Vec::len).sum();
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
        Ok(ids)
    }

    async fn insert_on_shard(
        &self,
        shard_index: usize,
        part: &[(usize, i32, NewJob)],
    ) -> Result<Vec<(usize, JobId)>, ClientError> {
        let shard = self.shards.get(shard_index);
        let client = shard.client().await?;
        let stmt = client
            .prepare_cached(sql::JOB_INSERT_MANY)
            .await
            .map_err(|e| shard.query_error(e))?;
        let mut out = Vec::with_capacity(part.len());
        for chunk in part.chunks(INSERT_CHUNK) {
            let keys: Vec<i32> = chunk.iter().map(|(_, k, _)| *k).collect();
            let queues: Vec<&str> = chunk.iter().map(|(_, _, j)| j.queue.as_str()).collect();
            let handlers: Vec<&str> = chunk.iter().map(|(_, _, j)| j.handler.as_str()).collect();
            let ordering: Vec<Option<&str>> = chunk
                .iter()
                .map(|(_, _, j)| j.ordering_key.as_deref())
                .collect();
            let priorities: Vec<i32> = chunk.iter().map(|(_, _, j)| j.priority).collect();
            let payloads: Vec<&Value> = chunk.iter().map(|(_, _, j)| &j.payload).collect();
            let rows = client
                .query(
                    &stmt,
                    &[&keys, &queues, &handlers, &ordering, &priorities, &payloads],
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
    }

    /// Rejects what PostgreSQL would refuse or what exceeds the limits, before
    /// anything is written.
    fn check(&self, index: usize, job: &NewJob) -> Result<(), ClientError> {
        let invalid = |reason: String| ClientError::Invalid { index, reason };
        for (what, value) in [("queue", &job.queue), ("handler", &job.handler)] {
            if value.is_empty() {
                return Err(invalid(format!("{what} name is empty")));
            }
        }
        let names = [("queue", Some(&job.queue)), ("handler", Some(&job.handler))];
        for (what, value) in names
            .into_iter()
            .chain([("ordering key", job.ordering_key.as_ref())])
        {
            if value.is_some_and(|v| v.contains('\0')) {
                return Err(invalid(format!(
                    "{what} contains a NUL byte, which PostgreSQL text cannot store"
                )));
            }
        }
        let text = job.payload.to_string();
        if text.len() > self.limits.max_payload_bytes {
            return Err(invalid(format!(
                "payload is {} bytes, over limits.max_payload_bytes = {}",
                text.len(),
                self.limits.max_payload_bytes
            )));
        }
        if text.contains("\\u0000") {
            return Err(invalid(
                "payload contains a \\u0000 character, which PostgreSQL jsonb cannot store".into(),
            ));
        }
        Ok(())
    }

    /// Whether `queue` has any queued or running job on any shard.
    ///
    /// # Errors
    ///
    /// When a shard cannot be asked (then the answer is unknown).
    pub async fn has_pending(&self, queue: &str) -> Result<bool, ClientError> {
        for shard in self.shards.all() {
            let client = shard.client().await?;
            let row = client
                .query_one(sql::QUEUE_HAS_PENDING, &[&queue])
                .await
                .map_err(|e| shard.query_error(e))?;
            if row.get::<_, bool>(0) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Per shard: reachable or not, and job counts by queue and status.
    pub async fn status(&self) -> Vec<ShardStatus> {
        let asks = self.shards.all().iter().map(|shard| async move {
            let result: Result<Vec<QueueCount>, ShardError> = async {
                let client = shard.client().await?;
                let rows = client
                    .query(sql::QUEUE_COUNTS, &[])
                    .await
                    .map_err(|e| shard.query_error(e))?;
                Ok(rows
                    .iter()
                    .map(|r| QueueCount {
                        queue: r.get(0),
                        status: r.get(1),
                        count: r.get(2),
                    })
                    .collect())
            }
            .await;
            let (counts, error) = match result {
                Ok(c) => (Some(c), None),
                Err(e) => (None, Some(crate::error_chain(&e))),
            };
            ShardStatus {
                shard: shard.name.clone(),
                target: shard.target().to_string(),
                counts,
                error,
            }
        });
        futures_util::future::join_all(asks).await
    }
}
