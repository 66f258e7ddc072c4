//! Child workflows, on their parent's shard: [`JobContext::start_child`]
//! and [`ChildHandle::result`].

use super::context::{HandlerError, JobContext, StepError};
use crate::job::{ChildPolicy, EnqueueLimits, InvalidJob, JobId, NewJob};
use crate::store::children::{self, AwaitChild, Awaited, StartChild, Started, CHILD_RECHECK};
use serde_json::Value;
use std::sync::atomic::Ordering;

/// The step name of a workflow's `n`th child (from 1).
fn child_step(n: u32) -> String {
    format!("shardq:child:{n}")
}

/// How a child workflow ended, as [`ChildHandle::result`] returns it.
///
/// A value, not an error: a child that failed is an outcome the parent
/// decides about (compensate, retry another way, fail itself), and the
/// decision is recorded, so every replay of the parent sees the same.
#[derive(Debug, Clone, PartialEq)]
pub enum ChildResult {
    /// It succeeded, with its output (`Value::Null` when it had none).
    Succeeded(Value),
    /// It failed for good (`dead`: out of attempts, or a permanent
    /// failure), with its last error.
    Failed(String),
    /// It was cancelled (its parent's cancel cascades to it, or an
    /// operator's), with the reason recorded, if any.
    Cancelled(Option<String>),
}

impl ChildResult {
    /// The recorded outcome of a result step (`status`, `output`, `error`).
    fn from_recorded(recorded: &Value) -> ChildResult {
        let error = recorded
            .get("error")
            .and_then(Value::as_str)
            .map(str::to_string);
        match recorded.get("status").and_then(Value::as_str) {
            Some("succeeded") => {
                ChildResult::Succeeded(recorded.get("output").cloned().unwrap_or(Value::Null))
            }
            Some("cancelled") => ChildResult::Cancelled(error),
            _ => ChildResult::Failed(error.unwrap_or_default()),
        }
    }
}

/// Why a child workflow was not started, or its result cannot be read
/// (the source of [`StepError::Failed`]).
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// The child job is invalid.
    #[error("the child job is invalid")]
    Invalid(#[source] InvalidJob),
    /// A child with a deduplication id: its identity is its parent's step.
    #[error("a child workflow cannot have a deduplication id: start_child already starts it exactly once per call site; drop the deduplication id")]
    Deduplicated,
    /// The child's ordering key or group routes it to another shard.
    #[error("the child's ordering key or group routes it to shard_key {shard_key} (shard {shard}), not to its parent's shard: cross-shard child workflows are not supported yet; start it without a key or group (it then takes its parent's shard key), or enqueue it with the client")]
    OtherShard {
        /// The shard key its key routes to.
        shard_key: i32,
        /// The shard that holds that key (`?` when the map has none).
        shard: String,
    },
    /// The child's row is not on the parent's shard any more (finished and
    /// removed by retention before the parent asked, or moved away).
    #[error("child workflow {0} is not on its parent's shard (removed by retention after it finished, or moved); await children before retention removes them")]
    Missing(JobId),
}

/// A child workflow started by [`JobContext::start_child`].
#[derive(Debug, Clone)]
pub struct ChildHandle {
    ctx: JobContext,
    step: String,
    child: JobId,
}

impl ChildHandle {
    /// The child workflow's id (the same on every replay of its parent).
    pub fn id(&self) -> JobId {
        self.child
    }

    /// How the child ended, recorded as a step of the parent (named
    /// `shardq:child:N:result`): a replay returns the same. A child that
    /// finished before this call (even before the parent ran it) returns
    /// at once. An unfinished one makes this call return
    /// [`StepError::WaitingForChild`]: return it (`?`) and the parent
    /// parks, holding no slot, lease or permit (so a parent cannot starve
    /// its children under a concurrency limit), until the child's final
    /// status (succeeded, dead, cancelled; not a failed attempt that will
    /// be retried) wakes it; then it runs again from the start.
    ///
    /// # Errors
    ///
    /// [`StepError::WaitingForChild`] (park); `Cancelled`, `Fenced`,
    /// `Database` as for [`JobContext::step`]; `Failed` with
    /// [`ChildError::Missing`] when the child's row is gone.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: a decision is recorded in its transaction,
    /// and the next call returns it.
    pub async fn result(&self) -> Result<ChildResult, StepError> {
        let ctx = &self.ctx;
        let name = format!("{}:result", self.step);
        let awaited = children::result(
            &ctx.shard,
            AwaitChild {
                parent: ctx.id,
                name: &name,
                child: self.child,
                owner: &ctx.owner,
                fence: ctx.fence,
                recheck: CHILD_RECHECK,
            },
        )
        .await
        .map_err(|source| StepError::Database {
            step: name.clone(),
            source,
        })?;
        match awaited {
            Awaited::Finished(recorded) => Ok(ChildResult::from_recorded(&recorded)),
            Awaited::Waiting(_) => {
                ctx.parked.store(true, Ordering::SeqCst);
                Err(StepError::WaitingForChild(ctx.id, self.child))
            }
            Awaited::Missing => Err(StepError::Failed {
                step: name,
                source: Box::new(ChildError::Missing(self.child)),
            }),
            Awaited::Cancelled => Err(StepError::Cancelled(ctx.id, name)),
            Awaited::NotHeld => Err(StepError::Fenced(ctx.id, name)),
        }
    }
}

impl JobContext {
    /// Starts `job` as a child workflow of this one, exactly once per call
    /// site: the start is a step named `shardq:child:N` (N counting this
    /// run's `start_child` calls from 1, so the code must reach them in
    /// the same order on every run), and the child's row and that step's
    /// record are written in one transaction on this workflow's shard, so
    /// a replay, or a retry after a crash at any point, returns the same
    /// child and starts no second one. Fenced like a step: an attempt that
    /// lost its lease starts nothing.
    ///
    /// The child lives on its parent's shard: it takes the parent's shard
    /// key, or, with an ordering key or a group, its key's, which must be
    /// on this shard (cross-shard children are the next step). A
    /// cancel of the parent cancels its unfinished children
    /// ([`Client::cancel`]), but those started with
    /// [`ChildPolicy::Abandon`] ([`NewJob::on_parent_cancel`]).
    ///
    /// # Errors
    ///
    /// [`StepError::Failed`] with a [`ChildError`]: the job is invalid, has
    /// a deduplication id, or routes to another shard (nothing written);
    /// `Cancelled`, `Fenced`, `Database` as for [`JobContext::step`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: a repeat finds the step recorded.
    ///
    /// [`Client::cancel`]: crate::Client::cancel
    pub async fn start_child(&self, job: NewJob) -> Result<ChildHandle, StepError> {
        let name = child_step(self.children.fetch_add(1, Ordering::SeqCst) + 1);
        let refused = |e: ChildError| StepError::Failed {
            step: name.clone(),
            source: Box::new(e) as HandlerError,
        };
        let limits = EnqueueLimits {
            max_payload_bytes: self.max_message_bytes,
            default_max_attempts: self.default_max_attempts,
        };
        job.validate(&limits)
            .map_err(|e| refused(ChildError::Invalid(e)))?;
        if job.dedup_id.is_some() {
            return Err(refused(ChildError::Deduplicated));
        }
        let started = children::start(
            &self.shard,
            StartChild {
                parent: self.id,
                name: &name,
                owner: &self.owner,
                fence: self.fence,
                queue: &job.queue,
                handler: &job.handler,
                payload: &job.payload,
                ordering_key: job.ordering_key.as_deref(),
                group: job.group.as_deref(),
                priority: job.priority,
                delay: job.delay,
                max_attempts: job.max_attempts.unwrap_or(self.default_max_attempts),
                abandon_on_parent_cancel: job.on_parent_cancel == ChildPolicy::Abandon,
                timeout_ms: job.timeout_ms(),
            },
        )
        .await
        .map_err(|source| StepError::Database {
            step: name.clone(),
            source,
        })?;
        match started {
            Started::Child(child) => Ok(ChildHandle {
                ctx: self.clone(),
                step: name,
                child,
            }),
            Started::OtherShard(shard_key, shard) => Err(refused(ChildError::OtherShard {
                shard_key,
                shard: shard.map_or_else(|| "?".to_string(), |s| s.to_string()),
            })),
            Started::Cancelled => Err(StepError::Cancelled(self.id, name)),
            Started::NotHeld => Err(StepError::Fenced(self.id, name)),
        }
    }
}
