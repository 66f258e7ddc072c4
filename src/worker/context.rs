//! What a handler is given: its job, cancellation, and durable steps.

use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use crate::store::steps::{self, RecordStep};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;
use tokio_util::sync::CancellationToken;

/// Any error a handler returns; its `Display` chain becomes the job's error.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// Why a durable step did not return an output.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The step's closure failed; nothing was recorded, so the next attempt runs it again.
    #[error("step `{step}` failed")]
    Failed {
        /// Step name.
        step: String,
        /// The closure's error.
        #[source]
        source: HandlerError,
    },
    /// The recorded output no longer deserialises as the type asked for
    /// (the step's code changed its output type since it ran).
    #[error("step `{step}`: its recorded output does not deserialise as the requested type; keep step output types compatible or rename the step")]
    Decode {
        /// Step name.
        step: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The workflow's cancellation was asked: stop.
    #[error("workflow {0} was cancelled; step `{1}` was not recorded")]
    Cancelled(JobId, String),
    /// This attempt lost its lease (another worker owns the workflow now): stop.
    #[error("workflow {0} is no longer owned by this attempt; step `{1}` was not recorded")]
    Fenced(JobId, String),
    /// Reading or recording the step failed.
    #[error("step `{step}`: database error")]
    Database {
        /// Step name.
        step: String,
        /// Cause.
        #[source]
        source: ShardError,
    },
}

/// A running job: its data, its cancellation signal, and durable steps.
#[derive(Debug, Clone)]
pub struct JobContext {
    /// The job.
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// Its ordering key.
    pub ordering_key: Option<String>,
    /// Its payload.
    pub payload: Value,
    /// This attempt's number, from 1.
    pub attempt: i32,
    /// When the job was enqueued: its row's `created_at`, by the shard's
    /// clock (the same on every attempt). Now minus this is how long it has
    /// waited, retries included, give or take the two clocks' difference.
    pub enqueued_at: SystemTime,
    pub(crate) fence: i64,
    pub(crate) shard: Shard,
    pub(crate) owner: Arc<str>,
    pub(crate) cancel: CancellationToken,
}

impl JobContext {
    /// Whether cancellation of this job was asked (`shardq job cancel`).
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Completes when cancellation of this job is asked.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: use it in a `tokio::select!` beside the work.
    ///
    /// # Errors
    ///
    /// None: it only waits.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// Runs `work` once per workflow and records its output on the workflow's
    /// shard. When the workflow runs again (after a crash or a retry), a step
    /// that completed returns its recorded output without running. A step that
    /// fails records nothing and runs again on the next attempt.
    ///
    /// # Errors
    ///
    /// [`StepError`]; `Cancelled` and `Fenced` mean the handler should stop.
    ///
    /// # Cancel safety
    ///
    /// Dropped while `work` runs, nothing is recorded and the step runs again
    /// next time; dropped while the output is recorded, it may be recorded (the
    /// next call returns it).
    pub async fn step<T, F, Fut>(&self, name: &str, work: F) -> Result<T, StepError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, HandlerError>>,
    {
        let db = |source| StepError::Database {
            step: name.to_string(),
            source,
        };
        let shard = &self.shard;
        let recorded = steps::get(shard, self.id, name).await.map_err(db)?;
        if let Some(output) = recorded {
            return serde_json::from_value(output.unwrap_or(Value::Null)).map_err(|source| {
                StepError::Decode {
                    step: name.to_string(),
                    source,
                }
            });
        }
        if self.is_cancelled() {
            return Err(StepError::Cancelled(self.id, name.to_string()));
        }
        let output = work().await.map_err(|source| StepError::Failed {
            step: name.to_string(),
            source,
        })?;
        let value = serde_json::to_value(&output).map_err(|source| StepError::Decode {
            step: name.to_string(),
            source,
        })?;
        let step = RecordStep {
            id: self.id,
            name,
            output: &value,
            owner: &self.owner,
            fence: self.fence,
        };
        let written = steps::record(shard, step).await.map_err(db)?;
        match written {
            true => Ok(output),
            false if self.is_cancelled() => Err(StepError::Cancelled(self.id, name.to_string())),
            false => Err(StepError::Fenced(self.id, name.to_string())),
        }
    }
}
