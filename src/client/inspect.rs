//! Reading jobs and queues, cancelling and retrying single jobs.

use super::{Client, ClientError};
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use crate::sql;
use serde_json::Value;
use std::time::{Duration, Instant};
use tokio_postgres::types::Type;

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
    /// An estimate from the table's statistics (finished jobs on a big
    /// table: queue `*`, status `finished`), not a count.
    pub estimated: bool,
}

/// Up to this many finished rows (by the statistics' estimate), `status`
/// counts them exactly by queue and status; beyond, it reports the estimate.
const FINISHED_EXACT_UP_TO: i64 = 200_000;

/// What `status` reports for one shard.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShardStatus {
    /// Shard name.
    pub shard: String,
    /// host:port/dbname.
    pub target: String,
    /// Counts, when the shard answered.
    pub counts: Option<Vec<QueueCount>>,
    /// Connections the server holds, when it answered.
    pub connections: Option<Connections>,
    /// Why it did not answer.
    pub error: Option<String>,
}

/// Client connections a shard's server holds (from every process).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Connections {
    /// shardq's own (application name `shardq`).
    pub shardq: i64,
    /// For users' statements through shardq (`shardq-user`).
    pub user: i64,
    /// All client connections.
    pub total: i64,
    /// The server's `max_connections`.
    pub max: i64,
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
            let row = shard
                .within(async {
                    let client = shard.client().await?;
                    client
                        .query_typed_one(sql::QUEUE_HAS_PENDING, &[(&queue, Type::TEXT)])
                        .await
                        .map_err(|e| shard.query_error(e))
                })
                .await?;
            if row.get::<_, bool>(0) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Per shard: reachable or not, and job counts by queue and status.
    pub async fn status(&self) -> Vec<ShardStatus> {
        let asks = self.shards.all().iter().map(|shard| async move {
            let result: Result<_, ShardError> = shard
                .within(async {
                    let client = shard.client().await?;
                    let rows = client
                        .query_typed(sql::QUEUE_COUNTS, &[])
                        .await
                        .map_err(|e| shard.query_error(e))?;
                    let mut counts: Vec<QueueCount> = rows
                        .iter()
                        .map(|r| QueueCount {
                            queue: r.get(0),
                            status: r.get(1),
                            count: r.get(2),
                            estimated: false,
                        })
                        .collect();
                    let finished: i64 = client
                        .query_typed_one(sql::FINISHED_ESTIMATE, &[])
                        .await
                        .map_err(|e| shard.query_error(e))?
                        .get(0);
                    if finished <= FINISHED_EXACT_UP_TO {
                        let rows = client
                            .query_typed(sql::FINISHED_COUNTS, &[])
                            .await
                            .map_err(|e| shard.query_error(e))?;
                        counts.extend(rows.iter().map(|r| QueueCount {
                            queue: r.get(0),
                            status: r.get(1),
                            count: r.get(2),
                            estimated: false,
                        }));
                    } else {
                        counts.push(QueueCount {
                            queue: "*".into(),
                            status: "finished".into(),
                            count: finished,
                            estimated: true,
                        });
                    }
                    let c = client
                        .query_typed_one(sql::SERVER_CONNECTIONS, &[])
                        .await
                        .map_err(|e| shard.query_error(e))?;
                    let connections = Connections {
                        shardq: c.get(0),
                        user: c.get(1),
                        total: c.get(2),
                        max: c.get(3),
                    };
                    Ok((counts, connections))
                })
                .await;
            let (counts, connections, error) = match result {
                Ok((c, n)) => (Some(c), Some(n), None),
                Err(e) => (None, None, Some(crate::error_chain(&e))),
            };
            ShardStatus {
                shard: shard.name.clone(),
                target: shard.target().to_string(),
                counts,
                connections,
                error,
            }
        });
        futures_util::future::join_all(asks).await
    }

    /// Everything stored about job `id`, or `None` when there is no such job.
    ///
    /// # Errors
    ///
    /// When its shard fails, or (for a job its shard does not have) when
    /// another shard fails, since the job may live there.
    pub async fn job(&self, id: JobId) -> Result<Option<JobInfo>, ClientError> {
        let found = self.find_row(id, sql::JOB_GET).await?;
        Ok(found.map(|(_, r)| JobInfo {
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
        let started = Instant::now();
        let (shard, mut row) = self
            .find_row(id, sql::JOB_OUTCOME)
            .await?
            .ok_or(ClientError::NotFound(id))?;
        loop {
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
            if started.elapsed() >= timeout {
                return Err(ClientError::Timeout(id, timeout));
            }
            tokio::time::sleep(RESULT_POLL_INTERVAL.min(timeout.saturating_sub(started.elapsed())))
                .await;
            row = query_job(shard, id, sql::JOB_OUTCOME)
                .await?
                .ok_or(ClientError::NotFound(id))?;
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
    ///
    /// The job's shard is the one its key routes to, or, when that one does
    /// not have it, the shard that holds it (a job written under an older
    /// shard map stays where it was written).
    async fn change(
        &self,
        id: JobId,
        statement: &str,
    ) -> Result<Option<tokio_postgres::Row>, ClientError> {
        let routed = self.shards.for_key(id.shard_key);
        if let Some(row) = change_on(routed, id, statement).await? {
            return Ok(Some(row));
        }
        // Nothing changed: the job is there in a state the statement leaves
        // alone, or it lives on another shard.
        match self.holder(id).await? {
            Some(shard) if shard.index != routed.index => change_on(shard, id, statement).await,
            _ => Ok(None),
        }
    }

    /// Runs a one-job read (`$1` shard key, `$2` id) on the shard the job's
    /// key routes to and, when that shard has no row, on the other shards in
    /// turn. Returns the first row and the shard it came from.
    ///
    /// # Errors
    ///
    /// When the routed shard fails, or when no shard had the row and one
    /// of them failed (the job may be there).
    async fn find_row<'s>(
        &'s self,
        id: JobId,
        statement: &str,
    ) -> Result<Option<(&'s Shard, tokio_postgres::Row)>, ClientError> {
        let routed = self.shards.for_key(id.shard_key);
        if let Some(row) = query_job(routed, id, statement).await? {
            return Ok(Some((routed, row)));
        }
        let mut failed = None;
        for shard in self.others(routed) {
            match query_job(shard, id, statement).await {
                Ok(Some(row)) => return Ok(Some((shard, row))),
                Ok(None) => {}
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        failed.map_or(Ok(None), |e| Err(e.into()))
    }

    /// The shard holding job `id`: the one its key routes to when that one
    /// has it, else the first other shard that has it (one primary-key
    /// probe per shard asked).
    ///
    /// # Errors
    ///
    /// As [`Client::find_row`].
    async fn holder(&self, id: JobId) -> Result<Option<&Shard>, ClientError> {
        Ok(self
            .find_row(id, sql::JOB_EXISTS)
            .await?
            .map(|(shard, _)| shard))
    }

    /// Every shard but `skip`, in routing order.
    fn others<'s>(&'s self, skip: &'s Shard) -> impl Iterator<Item = &'s Shard> + 's {
        self.shards
            .all()
            .iter()
            .filter(move |s| s.index != skip.index)
    }
}

/// Runs a one-job read (`$1` shard key, `$2` id) on `shard`.
async fn query_job(
    shard: &Shard,
    id: JobId,
    statement: &str,
) -> Result<Option<tokio_postgres::Row>, ShardError> {
    shard
        .within(async move {
            let client = shard.client().await?;
            client
                .query_typed_opt(
                    statement,
                    &[(&id.shard_key, Type::INT4), (&id.id, Type::INT8)],
                )
                .await
                .map_err(|e| shard.query_error(e))
        })
        .await
}

/// Runs a one-job change on `shard` in a transaction, under the job's key
/// lock (see [`Client::change`]).
async fn change_on(
    shard: &Shard,
    id: JobId,
    statement: &str,
) -> Result<Option<tokio_postgres::Row>, ClientError> {
    shard
        .within(async move {
            let err = |e| shard.query_error(e);
            let mut client = shard.client().await?;
            let tx = client.transaction().await.map_err(err)?;
            let (keys, ids) = ([id.shard_key], [id.id]);
            let params: [crate::sql::Param; 2] =
                [(&id.shard_key, Type::INT4), (&id.id, Type::INT8)];
            let mut rows = crate::dequeue::under_key_locks(&tx, &keys, &ids, statement, &params)
                .await
                .map_err(err)?;
            tx.commit().await.map_err(err)?;
            Ok(rows.pop())
        })
        .await
}
