//! What a client call can fail with.

use super::pending::PendingEnqueue;
use crate::job::{InvalidJob, JobId};
use crate::map_load::MapLoadError;
use crate::shards::ShardError;
use crate::store::{ErrorKind, JobStatus};

/// Errors from enqueueing or reading jobs.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A shard failed. From an enqueue: nothing of it was written when the
    /// error is transient ([`ShardError::is_permanent`] is false); a
    /// permanent one (bad data) may leave the jobs of other shards written.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// A shard did not confirm an enqueue, after retries: some of its jobs
    /// may be written, some not. [`Client::enqueue_again`](super::Client::enqueue_again) with `pending`
    /// writes the rest and returns every id, each job exactly once.
    #[error(
        "enqueue of {} jobs not confirmed (some may be written): pass the error's pending \
         enqueue to `Client::enqueue_again`, which writes each job exactly once",
        pending.len()
    )]
    OutcomeUnknown {
        /// The call, with its jobs' ids fixed.
        pending: Box<PendingEnqueue>,
        /// The last failure.
        #[source]
        source: ShardError,
    },
    /// The shard map could not be loaded (an enqueue routes by it); nothing
    /// was written.
    #[error("cannot load the shard map")]
    Map(#[from] MapLoadError),
    /// A job with [`OnDuplicate::Error`](crate::OnDuplicate::Error) whose deduplication id is taken.
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
    /// A message ([`Client::send`](super::Client::send)) to a workflow that
    /// cannot take it: none has this id (`status` is `None`), it has
    /// finished, or it is moving between shards. Nothing was stored.
    #[error("cannot send a message to workflow {to}: {}", refusal(*.status))]
    SendRefused {
        /// The workflow.
        to: JobId,
        /// Its status, when it exists.
        status: Option<JobStatus>,
    },
    /// A message that cannot be sent as it is (an empty or oversized topic
    /// or key, an oversized payload, a NUL): nothing was stored.
    #[error("message to workflow {to} rejected: {reason}")]
    InvalidMessage {
        /// The workflow.
        to: JobId,
        /// What is wrong and what to do.
        reason: crate::job::InvalidJob,
    },
    /// An event key or value that cannot be used as it is (an empty,
    /// oversized or NUL-holding key, an oversized value): nothing was
    /// written or read.
    #[error("event of workflow {workflow} rejected: {reason}")]
    InvalidEvent {
        /// The workflow.
        workflow: JobId,
        /// What is wrong and what to do.
        reason: crate::job::InvalidJob,
    },
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
    /// A queue limit that cannot be set (a concurrency of 0, or over
    /// 2,147,483,647).
    #[error("cannot limit queue `{queue}`: {why}")]
    BadLimit {
        /// Queue.
        queue: String,
        /// What is wrong.
        why: String,
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
    /// A change of a queue's limits that a later change replaced on some
    /// shards before it reached them: it is not what is in force there.
    #[error(
        "the limits of queue `{queue}` were changed again while this change was written: on {} \
         the later change is in force (`shardq limit list` tells what is); set them again if \
         this change should win",
        shards.join(", ")
    )]
    LimitSuperseded {
        /// The queue.
        queue: String,
        /// The shards where the later change is in force.
        shards: Vec<String>,
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

/// Why a workflow in `status` takes no message, and what to do.
fn refusal(status: Option<JobStatus>) -> String {
    match status {
        None => "no such workflow exists (send to the id its enqueue returned)".to_string(),
        Some(JobStatus::Held) => {
            "it is moving between shards (`shardq reshard`): send again once the move is done"
                .to_string()
        }
        Some(status) => format!(
            "it has finished ({status}); messages go only to a workflow that has not \
             finished (waiting, scheduled, queued or running)"
        ),
    }
}

impl ClientError {
    /// What the shard failure behind this error means ([`ErrorKind`]), for
    /// [`ClientError::Shard`] and [`ClientError::OutcomeUnknown`](super::ClientError::OutcomeUnknown); `None`
    /// for errors about the jobs themselves (invalid, duplicate, not found,
    /// timed out waiting), which no retry of the same call changes.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            ClientError::Shard(e) | ClientError::OutcomeUnknown { source: e, .. } => Some(e.kind()),
            _ => None,
        }
    }
}
