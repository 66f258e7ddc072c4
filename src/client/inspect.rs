//! Reading jobs and queues, cancelling and retrying single jobs.

use super::{Client, ClientError};
use crate::job::JobId;
use crate::shards::ShardError;
use crate::sql;
use serde_json::Value;
use std::time::{Duration, Instant};

/// How often `result` looks at a job it waits for.
const RESULT_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// One queue/state count on one shard.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueueCount {
    /// Queue.
    pub queue: String,
    /// State: a status, or `delayed`/`retrying` for scheduled jobs.
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

/// Everything stored about one job.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobInfo {
    /// Identity.
    pub id: String,
    /// Queue.
    pub queue: String,
    /// Handler.
    pub handler: String,
    /// Ordering key.
    pub ordering_key: Option<String>,
    /// Priority.
    pub priority: i32,
    /// Status.
    pub status: String,
    /// Payload.
    pub payload: Value,
    /// Output, when it succeeded.
    pub output: Option<Value>,
    /// Last error.
    pub error: Option<String>,
    /// Attempts so far.
    pub attempts: i32,
    /// Attempt limit.
    pub max_attempts: i32,
    /// Current owner.
    pub owner: Option<String>,
    /// Deduplication id.
    pub dedup_id: Option<String>,
    /// Whether cancellation was asked.
    pub cancel_requested: bool,
    /// Times.
    pub created_at: Option<String>,
    /// Not claimable before.
    pub run_at: Option<String>,
    /// Last claim.
    pub started_at: Option<String>,
    /// Finish.
    pub finished_at: Option<String>,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq)]
pub enum JobOutcome {
    /// It succeeded with this output.
    Succeeded(Value),
    /// It failed on its last attempt with this error.
    Dead(String),
    /// It was cancelled.
    Cancelled,
}

impl Client {
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

    /// Everything stored about job `id`, or `None` when there is no such job.
    ///
    /// # Errors
    ///
    /// When its shard fails.
    pub async fn job(&self, id: JobId) -> Result<Option<JobInfo>, ClientError> {
        let shard = self.shards.for_key(id.shard_key);
        let client = shard.client().await?;
        let row = client
            .query_opt(sql::JOB_GET, &[&id.shard_key, &id.id])
            .await
            .map_err(|e| shard.query_error(e))?;
        Ok(row.map(|r| JobInfo {
            id: id.to_string(),
            queue: r.get(0),
            handler: r.get(1),
            ordering_key: r.get(2),
            priority: r.get(3),
            status: r.get(4),
            payload: r.get(5),
            output: r.get(6),
            error: r.get(7),
            attempts: r.get(8),
            max_attempts: r.get(9),
            owner: r.get(10),
            dedup_id: r.get(11),
            cancel_requested: r.get(12),
            created_at: r.get(13),
            run_at: r.get(14),
            started_at: r.get(15),
            finished_at: r.get(16),
        }))
    }

    /// Waits until job `id` has finished (succeeded, dead or cancelled), at
    /// most `timeout`, and returns how it ended.
    ///
    /// # Errors
    ///
    /// [`ClientError::Timeout`], [`ClientError::NotFound`], or a shard error.
    pub async fn result(&self, id: JobId, timeout: Duration) -> Result<JobOutcome, ClientError> {
        let shard = self.shards.for_key(id.shard_key);
        let started = Instant::now();
        loop {
            let client = shard.client().await?;
            let row = client
                .query_opt(sql::JOB_OUTCOME, &[&id.shard_key, &id.id])
                .await
                .map_err(|e| shard.query_error(e))?
                .ok_or(ClientError::NotFound(id))?;
            let status: &str = row.get(0);
            match status {
                "succeeded" => {
                    return Ok(JobOutcome::Succeeded(
                        row.get::<_, Option<Value>>(1).unwrap_or(Value::Null),
                    ))
                }
                "dead" | "failed" => {
                    return Ok(JobOutcome::Dead(
                        row.get::<_, Option<String>>(2).unwrap_or_default(),
                    ))
                }
                "cancelled" => return Ok(JobOutcome::Cancelled),
                _ => {}
            }
            drop(client);
            if started.elapsed() >= timeout {
                return Err(ClientError::Timeout(id, timeout));
            }
            tokio::time::sleep(RESULT_POLL_INTERVAL.min(timeout.saturating_sub(started.elapsed())))
                .await;
        }
    }

    /// Cancels job `id`: a waiting job at once (it never runs); a running one by
    /// telling its handler, which stops recording steps. Returns the status
    /// after the change (`cancelled` or `running`), or `None` when the job is
    /// unknown or already finished.
    ///
    /// # Errors
    ///
    /// When its shard fails.
    pub async fn cancel(&self, id: JobId) -> Result<Option<String>, ClientError> {
        let row = self.change(id, sql::JOB_CANCEL).await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Puts a dead, failed or cancelled job back in the queue with fresh
    /// attempts (behind any unfinished job of its key). Returns whether it did.
    ///
    /// # Errors
    ///
    /// [`ClientError::RetryDuplicate`] when an unfinished job of its queue
    /// holds its deduplication id now; otherwise when its shard fails.
    pub async fn retry(&self, id: JobId) -> Result<bool, ClientError> {
        match self.change(id, sql::JOB_RETRY).await {
            Ok(row) => Ok(row.is_some()),
            Err(ClientError::Shard(e))
                if e.sqlstate() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) =>
            {
                Err(ClientError::RetryDuplicate(id))
            }
            Err(e) => Err(e),
        }
    }

    /// Runs a one-job statement (`$1` shard key, `$2` id) on the job's shard,
    /// under the job's key lock, and releases the key afterwards if the
    /// change freed it (cancelling a retrying job, retrying an old one).
    async fn change(
        &self,
        id: JobId,
        statement: &str,
    ) -> Result<Option<tokio_postgres::Row>, ClientError> {
        let shard = self.shards.for_key(id.shard_key);
        let err = |e| shard.query_error(e);
        let mut client = shard.client().await?;
        let tx = client.transaction().await.map_err(err)?;
        let (keys, ids) = ([id.shard_key], [id.id]);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&id.shard_key, &id.id];
        let mut rows = crate::dequeue::under_key_locks(&tx, &keys, &ids, statement, &params)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(rows.pop())
    }
}
