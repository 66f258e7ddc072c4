//! What a handler is given: its job, cancellation, and durable steps.

use super::step_log::{Claim, Logged, StepLog};
use crate::job::JobId;
use crate::shards::{Shard, ShardError, ShardSet};
use crate::store::messages::{self, Received, Recv};
use crate::store::steps::{self, RecordStep, Sleep, Slept};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
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
    /// A durable sleep ([`JobContext::sleep`]) is not over: return this
    /// error (`?`) so the workflow parks until then, holding no slot, lease
    /// or permit; it runs again from the start at that time, its recorded
    /// steps and sleeps returning at once.
    #[error("workflow {0} sleeps until {}; return this error so it parks until then", utc(.1))]
    Sleeping(JobId, SystemTime),
    /// A [`JobContext::recv`] found no message of its topic and its
    /// timeout is not over: return this error (`?`) so the workflow parks
    /// (as for [`StepError::Sleeping`]) until a message of the topic is
    /// sent to it or the timeout ends, whichever is first; then it runs
    /// again from the start, and the recv returns the message or `None`.
    #[error("workflow {0} waits for a message on topic `{1}` until {}; return this error so it parks until then", utc(.2))]
    Waiting(JobId, String, SystemTime),
    /// An event ([`JobContext::set_event`], [`JobContext::get_event`])
    /// whose key or value cannot be used as it is (an empty, oversized or
    /// NUL-holding key, an oversized value): nothing was written or read,
    /// and the same call fails the same way on every run: fix the code.
    #[error("step `{step}`: event rejected: {reason}")]
    InvalidEvent {
        /// Step name.
        step: String,
        /// What is wrong and what to do.
        reason: crate::job::InvalidJob,
    },
    /// A [`ChildHandle::result`] found its child unfinished: return this
    /// error (`?`) so the workflow (`.0`) parks (as for
    /// [`StepError::Sleeping`]) until the child (`.1`) finishes, whose
    /// completion wakes it; then it runs again from the start, and the
    /// result step returns the child's outcome.
    ///
    /// [`ChildHandle::result`]: crate::ChildHandle::result
    #[error("workflow {0} waits for its child workflow {1}; return this error so it parks until the child finishes")]
    WaitingForChild(JobId, JobId),
    /// A call to another shard ([`JobContext::send`] to a workflow there,
    /// [`JobContext::start_child`] of a child keyed there) that the shard
    /// did not take: it did not answer, restarted, passed its statement
    /// deadline, or the key's range is being moved. Nothing was recorded
    /// and no attempt is spent. Return this error (`?`) so the workflow
    /// parks a few seconds, holding no slot, lease or permit; then it runs
    /// again from the start and makes the call again (idempotent).
    #[error("step `{step}`: the shard of key {shard_key} did not answer; return this error so the workflow parks and tries again in a few seconds")]
    Unreachable {
        /// Step name.
        step: String,
        /// The shard key on the other side.
        shard_key: i32,
        /// Why the call failed.
        #[source]
        source: HandlerError,
    },
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

/// `at` as an RFC 3339 UTC time, for messages.
fn utc(at: &SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(*at).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The step name of a workflow's `n`th durable sleep (from 1) in its code.
fn sleep_step(n: u32) -> String {
    format!("shardq:sleep:{n}")
}

/// The step name of a workflow's `n`th recv (from 1).
fn recv_step(n: u32) -> String {
    format!("shardq:recv:{n}")
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
    /// The workflow's recorded steps, read at this run's first step.
    pub(crate) steps: Arc<StepLog>,
    /// Durable sleeps called so far in this run (they are numbered in call
    /// order, the same on every run of deterministic code).
    pub(crate) sleeps: Arc<AtomicU32>,
    /// Messages sent so far in this run ([`JobContext::send`]), numbered
    /// like the sleeps.
    pub(crate) sends: Arc<AtomicU32>,
    /// Recvs called so far in this run ([`JobContext::recv`]), numbered
    /// like the sleeps.
    pub(crate) recvs: Arc<AtomicU32>,
    /// Events set so far in this run ([`JobContext::set_event`]),
    /// numbered like the sleeps.
    pub(crate) set_events: Arc<AtomicU32>,
    /// Events read so far in this run ([`JobContext::get_event`]),
    /// numbered like the sleeps.
    pub(crate) get_events: Arc<AtomicU32>,
    /// Every shard, for routing a message ([`JobContext::send`]) or
    /// finding another workflow's event ([`JobContext::get_event`]).
    pub(crate) shards: ShardSet,
    /// Largest message `send` and event `set_event` take
    /// (`limits.max_payload_bytes`).
    pub(crate) max_message_bytes: usize,
    /// Children started so far in this run ([`JobContext::start_child`]),
    /// numbered like the sleeps.
    pub(crate) children: Arc<AtomicU32>,
    /// Attempts of a child that does not say (`limits.default_max_attempts`).
    pub(crate) default_max_attempts: i32,
    /// Set when a sleep or a recv asked the workflow to park (its wake
    /// time is in its row's `run_at`).
    pub(crate) parked: Arc<AtomicBool>,
    /// What this process knows of each shard's answers: a call to a shard
    /// that does not answer parks without waiting on it.
    pub(crate) answers: super::worker_run::ShardAnswers,
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
        let claim = Claim {
            shard,
            id: self.id,
            owner: &self.owner,
            fence: self.fence,
        };
        match self.steps.get(claim, name).await.map_err(db)? {
            Logged::Recorded(output) => {
                return serde_json::from_value(output.unwrap_or(Value::Null)).map_err(|source| {
                    StepError::Decode {
                        step: name.to_string(),
                        source,
                    }
                })
            }
            Logged::NotHeld if self.is_cancelled() => {
                return Err(StepError::Cancelled(self.id, name.to_string()))
            }
            Logged::NotHeld => return Err(StepError::Fenced(self.id, name.to_string())),
            Logged::NotRecorded => {}
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
            true => {
                self.steps.recorded(name, value);
                Ok(output)
            }
            false if self.is_cancelled() || self.cancel_asked().await => {
                Err(StepError::Cancelled(self.id, name.to_string()))
            }
            false => Err(StepError::Fenced(self.id, name.to_string())),
        }
    }

    /// Whether the workflow's cancellation was asked (by `Client::cancel`
    /// or its deadline, `NewJob::timeout`) though the leaser has not told
    /// this context yet: read only when a step's record was refused, so a
    /// handler learns the cancel at that step (`StepError::Cancelled`), not
    /// as a lost lease. A failed read says no (the step is then `Fenced`:
    /// the handler stops either way).
    pub(super) async fn cancel_asked(&self) -> bool {
        crate::store::jobs::cancel_requested(&self.shard, &[self.id])
            .await
            .is_ok_and(|asked| asked.contains(&self.id))
    }

    /// Sleeps durably for `duration`, counted by the shard's clock from the
    /// first time the workflow reached this call. The first call records
    /// the wake time (a step named `shardq:sleep:N`, N counting this run's
    /// sleeps from 1) and returns [`StepError::Sleeping`]: return it (`?`)
    /// and the workflow *parks*: its slot, lease and any limit permit go,
    /// nothing runs, and it is claimed again at the wake time (retries and
    /// attempts are untouched). Run again, the workflow replays: its
    /// recorded steps return their outputs, and this call returns `Ok(())`
    /// once the wake time has passed. After a crash or a retry the sleep
    /// keeps its first wake time. Sleeps are told apart by their order, so
    /// the workflow's code must reach them in the same order on every run.
    ///
    /// # Errors
    ///
    /// [`StepError::Sleeping`] (park), `Cancelled`, `Fenced`, `Database`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: the wake time is recorded once.
    pub async fn sleep(&self, duration: Duration) -> Result<(), StepError> {
        self.sleep_step(duration, None).await
    }

    /// Sleeps durably until `at` ([`JobContext::sleep`], with an absolute
    /// wake time: one in the past returns at once).
    ///
    /// # Errors
    ///
    /// As [`JobContext::sleep`].
    pub async fn sleep_until(&self, at: SystemTime) -> Result<(), StepError> {
        self.sleep_step(Duration::ZERO, Some(at)).await
    }

    async fn sleep_step(
        &self,
        duration: Duration,
        until: Option<SystemTime>,
    ) -> Result<(), StepError> {
        let name = sleep_step(self.sleeps.fetch_add(1, Ordering::SeqCst) + 1);
        let sleep = Sleep {
            id: self.id,
            name: &name,
            duration,
            until,
            owner: &self.owner,
            fence: self.fence,
        };
        let slept =
            steps::sleep(&self.shard, sleep)
                .await
                .map_err(|source| StepError::Database {
                    step: name.clone(),
                    source,
                })?;
        match slept {
            Slept::Due => Ok(()),
            Slept::Until(at) => {
                self.parked.store(true, Ordering::SeqCst);
                Err(StepError::Sleeping(self.id, at))
            }
            Slept::Cancelled => Err(StepError::Cancelled(self.id, name)),
            Slept::NotHeld => Err(StepError::Fenced(self.id, name)),
        }
    }

    /// Receives a message on `topic` sent to this workflow ([`Client::send`],
    /// [`JobContext::send`]): its mailbox keeps a message sent before the
    /// workflow asks, gives a topic's messages in the order the shard
    /// stored them, and each once. The call is a step named
    /// `shardq:recv:N` (N counting this run's recvs from 1; its wait is
    /// recorded as `shardq:recv:N:wait`): a replay returns what it returned
    /// first.
    ///
    /// With a message there, it is taken and returned. With none, the
    /// first call records a deadline (the shard's clock plus `timeout`)
    /// and returns [`StepError::Waiting`]: return it (`?`) and the workflow
    /// parks (no slot, lease or permit held) until a message of the topic
    /// is sent to it (the send wakes it) or the deadline, then runs again
    /// from the start. Past the deadline with no message, it returns
    /// `Ok(None)` (recorded: a message sent later stays in the mailbox for
    /// a later recv of the topic). A message and the deadline that race
    /// are decided under the workflow's row lock: the message wins when
    /// its send committed first.
    ///
    /// # Errors
    ///
    /// [`StepError::Waiting`] (park), `Cancelled`, `Fenced`, `Database`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: a message taken is recorded in the same
    /// transaction, and the next call returns it.
    ///
    /// [`Client::send`]: crate::Client::send
    pub async fn recv(&self, topic: &str, timeout: Duration) -> Result<Option<Value>, StepError> {
        let name = recv_step(self.recvs.fetch_add(1, Ordering::SeqCst) + 1);
        let recv = Recv {
            id: self.id,
            name: &name,
            topic,
            timeout,
            owner: &self.owner,
            fence: self.fence,
        };
        let received =
            messages::recv(&self.shard, recv)
                .await
                .map_err(|source| StepError::Database {
                    step: name.clone(),
                    source,
                })?;
        match received {
            Received::Message(message) => Ok(Some(message)),
            Received::TimedOut => Ok(None),
            Received::Waiting(at) => {
                self.parked.store(true, Ordering::SeqCst);
                Err(StepError::Waiting(self.id, topic.to_string(), at))
            }
            Received::Cancelled => Err(StepError::Cancelled(self.id, name)),
            Received::NotHeld => Err(StepError::Fenced(self.id, name)),
        }
    }
}
