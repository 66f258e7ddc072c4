//! Child workflows: [`JobContext::start_child`] and
//! [`ChildHandle::result`], on the parent's shard in one round trip each,
//! or on another shard (`store::children_elsewhere` says how, and why
//! nothing is lost or done twice).

use super::context::{HandlerError, JobContext, StepError};
use super::step_log::{Claim, Logged};
use super::unreachable::{self, passes_by_itself};
use crate::job::{ChildPolicy, EnqueueLimits, InvalidJob, JobId, NewJob};
use crate::shards::ShardError;
use crate::store::children::{self, AwaitChild, Awaited, StartChild, Started, CHILD_RECHECK};
use crate::store::children_elsewhere::{
    self as elsewhere, ChildRow, Identity, Intent, ParentStep, Wait,
};
use crate::store::steps::{self, RecordStep};
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
    /// The child's row is not on its shard any more (finished and removed
    /// by retention before the parent asked).
    #[error("child workflow {0} is not on its shard (removed by retention after it finished); await children before retention removes them")]
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
        let routed = ctx.shards.for_key(self.child.shard_key).index;
        if routed != ctx.shard.index {
            if let Some(result) = self.result_elsewhere(&name, routed).await? {
                return Ok(result);
            }
        }
        if let Some(result) = self.result_here(&name).await? {
            return Ok(result);
        }
        // Neither where the map routes it nor on the parent's shard: this
        // process's map may be older than a move, or the child finished
        // before its range moved (a move leaves finished rows behind).
        match self.locate(&name, &[routed, ctx.shard.index]).await? {
            Some(found) => match self.result_elsewhere(&name, found).await? {
                Some(result) => Ok(result),
                None => Err(self.missing(name)),
            },
            None => Err(self.missing(name)),
        }
    }

    fn missing(&self, step: String) -> StepError {
        StepError::Failed {
            step,
            source: Box::new(ChildError::Missing(self.child)),
        }
    }

    /// The shard (not one of `tried`) that holds the child, asked of every
    /// other shard at once. An error when a shard that could hold it did
    /// not answer: the child is not known to be missing then.
    async fn locate(&self, name: &str, tried: &[usize]) -> Result<Option<usize>, StepError> {
        let ctx = &self.ctx;
        let asked = ctx
            .shards
            .all()
            .iter()
            .filter(|s| !tried.contains(&s.index));
        let answers = futures_util::future::join_all(asked.map(|shard| async move {
            (shard.index, elsewhere::read_child(shard, self.child).await)
        }))
        .await;
        let mut failed = None;
        for (index, answer) in answers {
            match answer {
                Ok(Some(_)) => return Ok(Some(index)),
                Ok(None) => {}
                Err(source) => failed = failed.or(Some(source)),
            }
        }
        match failed {
            Some(source) => Err(StepError::Database {
                step: name.to_string(),
                source,
            }),
            None => Ok(None),
        }
    }

    /// [`ChildHandle::result`] of a child on the parent's shard: one
    /// round trip ([`children::result`]). `None` when the child is not
    /// there.
    async fn result_here(&self, name: &str) -> Result<Option<ChildResult>, StepError> {
        let ctx = &self.ctx;
        let awaited = children::result(
            &ctx.shard,
            AwaitChild {
                parent: ctx.id,
                name,
                child: self.child,
                owner: &ctx.owner,
                fence: ctx.fence,
                recheck: CHILD_RECHECK,
            },
        )
        .await
        .map_err(|source| StepError::Database {
            step: name.to_string(),
            source,
        })?;
        match awaited {
            Awaited::Finished(recorded) => Ok(Some(ChildResult::from_recorded(&recorded))),
            Awaited::Waiting(_) => {
                ctx.parked.store(true, Ordering::SeqCst);
                Err(StepError::WaitingForChild(ctx.id, self.child))
            }
            Awaited::Missing => Ok(None),
            Awaited::Cancelled => Err(StepError::Cancelled(ctx.id, name.to_string())),
            Awaited::NotHeld => Err(StepError::Fenced(ctx.id, name.to_string())),
        }
    }

    /// [`ChildHandle::result`] of a child on shard `there`, another than
    /// the parent's: the wait recorded on the parent's shard first, then
    /// the child read there, then its outcome recorded when it has
    /// finished. `None` when the child is not there.
    async fn result_elsewhere(
        &self,
        name: &str,
        there: usize,
    ) -> Result<Option<ChildResult>, StepError> {
        let ctx = &self.ctx;
        let db = |source| StepError::Database {
            step: name.to_string(),
            source,
        };
        let parent = ParentStep {
            parent: ctx.id,
            name,
            owner: &ctx.owner,
            fence: ctx.fence,
        };
        match elsewhere::wait(&ctx.shard, parent, self.child, CHILD_RECHECK)
            .await
            .map_err(db)?
        {
            Wait::Decided(recorded) => return Ok(Some(ChildResult::from_recorded(&recorded))),
            Wait::Cancelled => return Err(StepError::Cancelled(ctx.id, name.to_string())),
            Wait::NotHeld => return Err(StepError::Fenced(ctx.id, name.to_string())),
            Wait::Recorded => {}
        }
        // A shard this worker's claims found silent is not asked, nor waited
        // on: the read would hold the parent's slot until its deadline.
        let shard = ctx.shards.get(there).clone();
        let (on, child) = (shard.clone(), self.child);
        let read = match ctx
            .unless_silent(
                &shard,
                async move { elsewhere::read_child(&on, child).await },
            )
            .await
        {
            Ok(Err(err)) if passes_by_itself(&err) => {
                tracing::warn!(job = %ctx.id, child = %self.child, error = %err, "the child's shard did not answer its read");
                None
            }
            Ok(read) => Some(read.map_err(db)?),
            Err(_silent) => None,
        };
        let Some(read) = read else {
            // The child's shard does not answer now: park, and look again
            // soon rather than fail an attempt per outage (the wait is
            // recorded, so a wake relayed meanwhile still comes; but one
            // relayed before it was recorded would not, so a recheck is due
            // either way).
            let after = unreachable::retry_after(ctx.answers.unanswering_for(there));
            elsewhere::recheck_soon(&ctx.shard, parent, after)
                .await
                .map_err(db)?;
            ctx.parked.store(true, Ordering::SeqCst);
            return Err(StepError::WaitingForChild(ctx.id, self.child));
        };
        let outcome = match read {
            None => return Ok(None),
            Some(None) => {
                ctx.parked.store(true, Ordering::SeqCst);
                return Err(StepError::WaitingForChild(ctx.id, self.child));
            }
            Some(Some(outcome)) => outcome,
        };
        let record = RecordStep {
            id: ctx.id,
            name,
            output: &outcome,
            owner: &ctx.owner,
            fence: ctx.fence,
        };
        match steps::record(&ctx.shard, record).await.map_err(db)? {
            true => Ok(Some(ChildResult::from_recorded(&outcome))),
            false if ctx.is_cancelled() || ctx.cancel_asked().await => {
                Err(StepError::Cancelled(ctx.id, name.to_string()))
            }
            false => Err(StepError::Fenced(ctx.id, name.to_string())),
        }
    }
}

impl JobContext {
    /// `err`, after reloading the shard map when it says the shard this
    /// process routed to does not hold the key (SQ001) or the map is old
    /// (SQ004): the attempt fails, and the next one routes by the new map.
    async fn stale_map_reloaded(&self, err: ShardError) -> ShardError {
        let code = err.sqlstate().map(|c| c.code().to_string());
        if matches!(code.as_deref(), Some("SQ001" | "SQ004")) {
            if let Err(reload) = self.shards.load_map().await {
                tracing::warn!(error = %reload, "cannot reload the shard map after a refused route");
            }
        }
        err
    }

    /// A write on the child's shard (key `shard_key`) failed: the map is
    /// reloaded when the shard refused the route; a failure that passes by
    /// itself (no answer, a restart, the range moving) parks the parent to
    /// start the child again soon ([`JobContext::park_unreachable`]), one
    /// that would repeat fails the attempt.
    async fn child_shard_failed(&self, step: String, shard_key: i32, err: ShardError) -> StepError {
        let err = self.stale_map_reloaded(err).await;
        if !passes_by_itself(&err) {
            return StepError::Database { step, source: err };
        }
        self.park_unreachable(step, shard_key, Box::new(err)).await
    }

    /// Starts `job` as a child workflow of this one, exactly once per call
    /// site: the start is a step named `shardq:child:N` (N counting this
    /// run's `start_child` calls from 1, so the code must reach them in
    /// the same order on every run), and the child's row and that step's
    /// record are written in one transaction on this workflow's shard, so
    /// a replay, or a retry after a crash at any point, returns the same
    /// child and starts no second one. Fenced like a step: an attempt that
    /// lost its lease starts nothing.
    ///
    /// The child takes the parent's shard key, or, with an ordering key or
    /// a group, its key's, which may live on another shard: the child is
    /// then written there in four round trips instead of one, each
    /// idempotent, so the promise is the same (one child per call site,
    /// whatever crashes). A
    /// cancel of the parent cancels its unfinished children
    /// ([`Client::cancel`]), but those started with
    /// [`ChildPolicy::Abandon`] ([`NewJob::on_parent_cancel`]).
    ///
    /// # Errors
    ///
    /// [`StepError::Failed`] with a [`ChildError`]: the job is invalid or has
    /// a deduplication id (nothing written); [`StepError::Unreachable`]
    /// (park) when the child's shard does not answer or its range is being
    /// moved; `Cancelled`, `Fenced`, `Database` as for [`JobContext::step`].
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
        let start = StartChild {
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
        };
        let routing = job.ordering_key.as_deref().or(job.group.as_deref());
        if let Some(key) = routing.map(crate::router::shard_key_for) {
            if self.shards.for_key(key).index != self.shard.index {
                return self.start_child_elsewhere(name.clone(), key, &start).await;
            }
        }
        let started = children::start(&self.shard, start)
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
            // The map moved since this process loaded it.
            Started::OtherShard(shard_key, _) => {
                self.start_child_elsewhere(name.clone(), shard_key, &start)
                    .await
            }
            Started::Cancelled => Err(StepError::Cancelled(self.id, name)),
            Started::NotHeld => Err(StepError::Fenced(self.id, name)),
        }
    }

    /// [`JobContext::start_child`] of a child whose key (`shard_key`) is
    /// on another shard: its identity reserved there and recorded here,
    /// its row inserted there, its start recorded here.
    async fn start_child_elsewhere(
        &self,
        name: String,
        shard_key: i32,
        start: &StartChild<'_>,
    ) -> Result<ChildHandle, StepError> {
        let db = |source| StepError::Database {
            step: name.clone(),
            source,
        };
        let claim = Claim {
            shard: &self.shard,
            id: self.id,
            owner: &self.owner,
            fence: self.fence,
        };
        let handle = |child| ChildHandle {
            ctx: self.clone(),
            step: name.clone(),
            child,
        };
        let identity_step = format!("{name}:id");
        // The id reserved by this run, if it reserved one.
        let mut fresh = None;
        let reserved = match self.steps.get(claim, &identity_step).await.map_err(db)? {
            Logged::Recorded(Some(recorded)) => child_of(&recorded),
            Logged::NotHeld if self.is_cancelled() => {
                return Err(StepError::Cancelled(self.id, name))
            }
            Logged::NotHeld => return Err(StepError::Fenced(self.id, name)),
            Logged::Recorded(None) | Logged::NotRecorded => {
                let there = self.shards.for_key(shard_key);
                if let Err(silent) = self.answering(there) {
                    return Err(self.park_unreachable(name, shard_key, silent.into()).await);
                }
                match elsewhere::reserve_id(there, shard_key).await {
                    Ok(id) => *fresh.insert(JobId { shard_key, id }),
                    Err(e) => return Err(self.child_shard_failed(name, shard_key, e).await),
                }
            }
        };
        let parent = ParentStep {
            parent: self.id,
            name: &name,
            owner: &self.owner,
            fence: self.fence,
        };
        let identity = Identity {
            id: reserved,
            queue: start.queue,
            handler: start.handler,
        };
        let (child, parent_deadline) = match elsewhere::intent(&self.shard, parent, identity)
            .await
            .map_err(db)?
        {
            Intent::Started(child) => return Ok(handle(child)),
            Intent::Reserved(child, deadline) => (child, deadline),
            Intent::Cancelled => return Err(StepError::Cancelled(self.id, name)),
            Intent::NotHeld => return Err(StepError::Fenced(self.id, name)),
        };
        let row = ChildRow {
            id: child,
            parent: self.id,
            parent_deadline,
            job: start,
        };
        let there = self.shards.for_key(child.shard_key);
        if let Err(silent) = self.answering(there) {
            return Err(self
                .park_unreachable(name, child.shard_key, silent.into())
                .await);
        }
        let earlier = fresh != Some(child);
        if earlier {
            // An earlier run's child may be on any shard (a move since):
            // each is asked, and one found silent would hold the slot.
            if let Some(silent) = self
                .shards
                .all()
                .iter()
                .find_map(|s| self.answering(s).err())
            {
                return Err(self
                    .park_unreachable(name, child.shard_key, silent.into())
                    .await);
            }
        }
        if let Err(e) = elsewhere::insert_once(&self.shards, row, earlier).await {
            return Err(self.child_shard_failed(name, child.shard_key, e).await);
        }
        let started =
            serde_json::json!({ "child_shard_key": child.shard_key, "child_id": child.id });
        let record = RecordStep {
            id: self.id,
            name: &name,
            output: &started,
            owner: &self.owner,
            fence: self.fence,
        };
        match steps::record(&self.shard, record).await.map_err(db)? {
            true => {
                self.steps.recorded(&name, started);
                Ok(handle(child))
            }
            false if self.is_cancelled() || self.cancel_asked().await => {
                // The parent's cancel cascade may have run before the
                // child's row was there: cancel it here.
                if let Err(err) = crate::store::jobs::cancel(there, child).await {
                    tracing::warn!(%child, error = %err, "a child started across shards by a workflow cancelled meanwhile could not be cancelled: cancel it with `shardq job cancel`");
                }
                Err(StepError::Cancelled(self.id, name))
            }
            false => Err(StepError::Fenced(self.id, name)),
        }
    }
}

/// The child a recorded start or identity names.
fn child_of(recorded: &Value) -> JobId {
    JobId {
        shard_key: recorded["child_shard_key"].as_i64().unwrap_or_default() as i32,
        id: recorded["child_id"].as_i64().unwrap_or_default(),
    }
}
