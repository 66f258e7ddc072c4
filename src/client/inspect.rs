//! Reading jobs and queues, cancelling and retrying single jobs.

use super::error::ClientError;
use super::handle::Client;
use crate::job::JobId;
use crate::schedule::Schedule;
use crate::shards::{Shard, ShardError, ShardSet};
use crate::store::children_elsewhere;
use crate::store::horizon::{self, Horizon};
use crate::store::jobs::{self, JobInfo};
use crate::store::queues::{self, Connections, QueueCount};
use crate::store::workers::{self, WorkerRow};
use crate::store::{ErrorKind, JobStatus};
use serde_json::Value;
use std::future::Future;
use std::time::{Duration, Instant};

/// How often `result` looks at a job it waits for.
const RESULT_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// What `status` reports for one shard.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShardStatus {
    /// Shard name.
    pub shard: String,
    /// host:port/dbname.
    pub target: String,
    /// Counts, when the shard answered.
    pub counts: Option<Vec<QueueCount>>,
    /// Whether its `waiting`, `retrying`, `delayed` and `parked` jobs are
    /// missing from [`ShardStatus::counts`]: their read ran past half the
    /// shard's deadline (a long transaction holding the horizon, or
    /// millions of such jobs), and only the ready and running jobs were
    /// read.
    pub backlog_bounded: bool,
    /// Connections the server holds, when it answered.
    pub connections: Option<Connections>,
    /// What holds the shard's xmin horizon back, and the queue table's dead
    /// row versions; `None` when it did not answer or that read failed.
    pub horizon: Option<Horizon>,
    /// The wakes its finished children owe parents on other shards, not
    /// delivered yet, by the parents' shard (empty when none, or when the
    /// read failed).
    pub wakes_owed: Vec<crate::store::children_elsewhere::OwedToShard>,
    /// Why it did not answer.
    pub error: Option<String>,
    /// The schedules whose name routes to this shard (those given to
    /// [`Client::status_with`]).
    pub schedules: Vec<super::schedule_status::ScheduleStatus>,
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
    /// Whether `queue` has any queued, waiting, running or retrying job on
    /// any shard.
    ///
    /// # Errors
    ///
    /// When a shard cannot be asked (then the answer is unknown).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    pub async fn has_pending(&self, queue: &str) -> Result<bool, ClientError> {
        for shard in self.shards.all() {
            if queues::has_pending(shard, queue).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Per shard: reachable or not, job counts by queue and status, and
    /// what holds its xmin horizon back.
    ///
    /// # Errors
    ///
    /// None: a shard that fails is reported in its own entry.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn status(&self) -> Vec<ShardStatus> {
        self.status_with(&[]).await
    }

    /// [`Client::status`], and for each shard the last and next tick of the
    /// `schedules` that live on it.
    ///
    /// # Errors
    ///
    /// None: a shard that fails is reported in its own entry.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn status_with(&self, schedules: &[Schedule]) -> Vec<ShardStatus> {
        let now = chrono::Utc::now();
        let asks = self.shards.all().iter().map(|shard| async move {
            let mine: Vec<&Schedule> = schedules
                .iter()
                .filter(|s| self.shards.for_key(s.shard_key()).index == shard.index)
                .collect();
            let result: Result<_, ShardError> = async {
                Ok((
                    queues::counts(shard).await?,
                    queues::connections(shard).await?,
                ))
            }
            .await;
            let (counts, backlog_bounded, connections, error) = match result {
                Ok((c, n)) => (Some(c.counts), c.bounded, Some(n), None),
                Err(e) => (None, false, None, Some(crate::error_chain::error_chain(&e))),
            };
            // Worth knowing, not worth calling a shard down for.
            let horizon = match &error {
                Some(_) => None,
                None => horizon::read(shard)
                    .await
                    .inspect_err(|e| tracing::warn!(shard = %shard.name, error = %crate::error_chain::error_chain(e), "xmin horizon read failed"))
                    .ok(),
            };
            let wakes_owed = match &error {
                Some(_) => Vec::new(),
                None => children_elsewhere::owed_summary(&self.shards, shard.index)
                    .await
                    .inspect_err(|e| tracing::warn!(shard = %shard.name, error = %crate::error_chain::error_chain(e), "read of the wakes owed to other shards failed"))
                    .unwrap_or_default(),
            };
            let schedules = match &error {
                // One wait for a shard that does not answer is enough.
                Some(e) => super::schedule_status::unknown(&mine, now, e),
                None => super::schedule_status::of_shard(shard, &mine, now).await,
            };
            ShardStatus {
                shard: shard.name.clone(),
                target: shard.target().to_string(),
                counts,
                backlog_bounded,
                connections,
                horizon,
                wakes_owed,
                error,
                schedules,
            }
        });
        futures_util::future::join_all(asks).await
    }

    /// Each shard's client connections, in shard order; `None` for a shard
    /// that did not answer within `deadline`.
    ///
    /// # Errors
    ///
    /// None: a shard that fails is `None`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn connections(&self, deadline: Duration) -> Vec<Option<Connections>> {
        let asks = self.shards.all().iter().map(|shard| async move {
            tokio::time::timeout(deadline, queues::connections(shard))
                .await
                .ok()
                .and_then(Result::ok)
        });
        futures_util::future::join_all(asks).await
    }

    /// Per shard, in shard order, the wakes its finished children owe
    /// parents on other shards, by destination; `None` for a shard that
    /// did not answer within `deadline`.
    ///
    /// # Errors
    ///
    /// None: a shard that fails is `None`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn wakes_owed(
        &self,
        deadline: Duration,
    ) -> Vec<Option<Vec<children_elsewhere::OwedToShard>>> {
        let asks = self.shards.all().iter().map(|shard| async move {
            let read = children_elsewhere::owed_summary(&self.shards, shard.index);
            tokio::time::timeout(deadline, read)
                .await
                .ok()
                .and_then(Result::ok)
        });
        futures_util::future::join_all(asks).await
    }

    /// Each shard's live workers (a heartbeat within the last 15 s) with their
    /// cumulative counters there, in shard order; `None` for a shard that
    /// did not answer within `deadline`. Two reads a while apart give each
    /// shard's lock-miss rate and claim time over that while.
    ///
    /// # Errors
    ///
    /// None: a shard that fails is `None`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn live_workers(&self, deadline: Duration) -> Vec<Option<Vec<WorkerRow>>> {
        let asks = self.shards.all().iter().map(|shard| async move {
            tokio::time::timeout(
                deadline,
                workers::live(shard, crate::heartbeat::HEARTBEAT_TTL),
            )
            .await
            .ok()
            .and_then(Result::ok)
        });
        futures_util::future::join_all(asks).await
    }

    /// Everything stored about job `id`, or `None` when there is no such job.
    ///
    /// # Errors
    ///
    /// When its shard fails, or (for a job its shard does not have) when
    /// another shard fails, since the job may live there.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    pub async fn job(&self, id: JobId) -> Result<Option<JobInfo>, ClientError> {
        let found = self.find(id, |shard| jobs::get(shard, id)).await?;
        Ok(found.map(|(_, info)| info))
    }

    /// Waits until job `id` has finished (succeeded, dead or cancelled), at
    /// most `timeout`, and returns how it ended.
    ///
    /// # Errors
    ///
    /// [`ClientError::Timeout`], [`ClientError::NotFound`], or a shard error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads, and dropping it stops the wait.
    pub async fn result(&self, id: JobId, timeout: Duration) -> Result<JobOutcome, ClientError> {
        let started = Instant::now();
        let (mut shard, mut row) = self
            .find(id, |shard| jobs::outcome(shard, id))
            .await?
            .ok_or(ClientError::NotFound(id))?;
        loop {
            match row.status {
                JobStatus::Succeeded => {
                    return Ok(JobOutcome::Succeeded(row.output.unwrap_or(Value::Null)))
                }
                JobStatus::Dead | JobStatus::Failed => {
                    return Ok(JobOutcome::Dead(row.error.unwrap_or_default()))
                }
                JobStatus::Cancelled => return Ok(JobOutcome::Cancelled),
                _ => {}
            }
            if started.elapsed() >= timeout {
                return Err(ClientError::Timeout(id, timeout));
            }
            tokio::time::sleep(RESULT_POLL_INTERVAL.min(timeout.saturating_sub(started.elapsed())))
                .await;
            row = match jobs::outcome(shard, id).await? {
                Some(row) => row,
                // Moved by `shardq reshard` (written on its new shard
                // before it left this one): look for it again.
                None => {
                    (shard, row) = self
                        .find(id, |shard| jobs::outcome(shard, id))
                        .await?
                        .ok_or(ClientError::NotFound(id))?;
                    row
                }
            };
        }
    }

    /// Cancels job `id`: a waiting job at once (it never runs); a running one by
    /// telling its handler, which stops recording steps. Then its unfinished
    /// child workflows (`JobContext::start_child`), and theirs, the same way
    /// (even when `id` itself had finished). Returns the status of `id`
    /// after the change (`cancelled` or `running`), or `None` when the job
    /// is unknown or already finished.
    ///
    /// # Errors
    ///
    /// When its shard fails (children cancelled before that stay
    /// cancelled; calling again cancels the rest).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped after the statement was sent, the job may be
    /// cancelled; calling again is harmless (it answers `None` or `running`).
    pub async fn cancel(&self, id: JobId) -> Result<Option<JobStatus>, ClientError> {
        let cancelled = self
            .change(id, |shard| async move {
                let cancelled = jobs::cancel_owing(shard, id).await?;
                Ok(cancelled.map(|c| (c, shard.index)))
            })
            .await?;
        let owed = cancelled.map(|(c, at)| (at, c.owed));
        self.cancel_children(id, owed).await?;
        Ok(cancelled.map(|(c, _)| c.status))
    }

    /// Puts a dead, failed or cancelled job back in the queue with fresh
    /// attempts (behind any unfinished job of its key). Returns whether it did.
    ///
    /// # Errors
    ///
    /// [`ClientError::RetryDuplicate`] when an unfinished job of its queue
    /// holds its deduplication id now; otherwise when its shard fails.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped after the statement was sent, the job may be
    /// back in the queue; calling again then answers `false`.
    pub async fn retry(&self, id: JobId) -> Result<bool, ClientError> {
        let retried = self
            .change(id, |shard| async move {
                Ok(jobs::retry(shard, id).await?.then_some(()))
            })
            .await;
        match retried {
            Ok(done) => Ok(done.is_some()),
            Err(ClientError::Shard(e)) if e.kind() == ErrorKind::UniqueViolation => {
                Err(ClientError::RetryDuplicate(id))
            }
            Err(e) => Err(e),
        }
    }

    /// Makes a change to job `id` (`change` returns `None` when it changed
    /// nothing) on the shard its key routes to, or, when that one changed
    /// nothing and does not have the job, on the shard that holds it (a job
    /// written under an older shard map stays where it was written).
    async fn change<'s, T, F, Fut>(&'s self, id: JobId, change: F) -> Result<Option<T>, ClientError>
    where
        F: Fn(&'s Shard) -> Fut,
        Fut: Future<Output = Result<Option<T>, ShardError>>,
    {
        let routed = self.shards.for_key(id.shard_key);
        if let Some(done) = change(routed).await? {
            return Ok(Some(done));
        }
        let holder = self
            .find(id, |shard| async move {
                Ok(jobs::exists(shard, id).await?.then_some(()))
            })
            .await?;
        match holder {
            // The routed shard again: a move wrote the job there since.
            Some((shard, ())) => Ok(change(shard).await?),
            None => Ok(None),
        }
    }

    /// Runs a one-job read on the shard the job's key routes to and, when
    /// that shard has no row, on the other shards in turn, then on the routed
    /// one again. Returns the first answer and the shard it came from.
    ///
    /// # Errors
    ///
    /// When the routed shard fails, or when no shard had the row and one
    /// of them failed (the job may be there).
    pub(super) async fn find<'s, T, F, Fut>(
        &'s self,
        id: JobId,
        read: F,
    ) -> Result<Option<(&'s Shard, T)>, ClientError>
    where
        F: Fn(&'s Shard) -> Fut,
        Fut: Future<Output = Result<Option<T>, ShardError>>,
    {
        find_in(&self.shards, id, read).await
    }
}

/// [`Client::find`] over `shards`: `read` on the shard `id` routes to,
/// then on the others, then on the routed one again.
pub(crate) async fn find_in<'s, T, F, Fut>(
    shards: &'s ShardSet,
    id: JobId,
    read: F,
) -> Result<Option<(&'s Shard, T)>, ClientError>
where
    F: Fn(&'s Shard) -> Fut,
    Fut: Future<Output = Result<Option<T>, ShardError>>,
{
    let routed = shards.for_key(id.shard_key);
    if let Some(found) = read(routed).await? {
        return Ok(Some((routed, found)));
    }
    let mut failed = None;
    for shard in shards.all().iter().filter(|s| s.index != routed.index) {
        match read(shard).await {
            Ok(Some(found)) => return Ok(Some((shard, found))),
            Ok(None) => {}
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    // A move (`shardq reshard`) may have copied the job to the routed
    // shard after it was asked and removed it from the old one before
    // that one was: the copy is written first, so asking again finds it.
    if let Some(found) = read(routed).await? {
        return Ok(Some((routed, found)));
    }
    failed.map_or(Ok(None), |e| Err(e.into()))
}
