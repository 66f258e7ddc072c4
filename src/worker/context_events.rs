//! Workflow events on a handler's context: `set_event` publishes a value
//! under a key, exactly once per call; `get_event` reads another
//! workflow's, as a step, so a replay returns what the first run got.

use super::context::{HandlerError, JobContext, StepError};
use crate::client::events::wait_for_event;
use crate::job::{validate_event, JobId};
use crate::store::events::{self, EventSet, SetEvent};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The step name of a workflow's `n`th set_event (from 1).
fn set_event_step(n: u32) -> String {
    format!("shardq:set_event:{n}")
}

/// The step name of a workflow's `n`th get_event (from 1).
fn get_event_step(n: u32) -> String {
    format!("shardq:get_event:{n}")
}

impl JobContext {
    /// Publishes `value` under `key` for others to read before this
    /// workflow ends ([`Client::get_event`], [`JobContext::get_event`],
    /// `shardq_get_event` in SQL). Exactly once per call: the call is a
    /// step named `shardq:set_event:N` (N counting this run's set_events
    /// from 1, so the code must reach them in the same order on every
    /// run), recorded in the same transaction as the event is written, and
    /// only while this attempt holds the workflow (its lease and fence)
    /// and it is not being cancelled. A replay (after a crash or a retry)
    /// writes nothing again; a later set_event of the same key overrides
    /// an earlier one, so the last in code order wins, replayed or not.
    ///
    /// # Errors
    ///
    /// [`StepError::InvalidEvent`] for an empty, NUL-holding or over-255-
    /// byte key, or a value over `limits.max_payload_bytes` (nothing
    /// written); `Cancelled`, `Fenced` (nothing written: the handler
    /// should stop), `Database`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: a repeat finds the step recorded and writes
    /// nothing.
    ///
    /// [`Client::get_event`]: crate::Client::get_event
    pub async fn set_event(&self, key: &str, value: Value) -> Result<(), StepError> {
        let name = set_event_step(self.set_events.fetch_add(1, Ordering::SeqCst) + 1);
        validate_event(key, Some(&value), self.max_message_bytes).map_err(|reason| {
            StepError::InvalidEvent {
                step: name.clone(),
                reason,
            }
        })?;
        let set = SetEvent {
            id: self.id,
            name: &name,
            key,
            value: &value,
            owner: &self.owner,
            fence: self.fence,
        };
        let done = events::set(&self.shard, set)
            .await
            .map_err(|source| StepError::Database {
                step: name.clone(),
                source,
            })?;
        match done {
            EventSet::Set => Ok(()),
            EventSet::Cancelled => Err(StepError::Cancelled(self.id, name)),
            EventSet::NotHeld => Err(StepError::Fenced(self.id, name)),
        }
    }

    /// The value workflow `workflow` published under `key`, waiting up to
    /// `timeout` for it ([`Client::get_event`]): `Ok(None)` when it was not
    /// set by then. The call is a step named `shardq:get_event:N` (N
    /// counting this run's get_events from 1): a replay returns what the
    /// first run got, the value or the timeout's `None`, without looking
    /// again.
    ///
    /// The wait is in process: this handler keeps its slot, lease and any
    /// limit permit while it waits (unlike [`JobContext::recv`], it does
    /// not park), so keep `timeout` short, or wait for a message instead
    /// when the wait may be long. A cancellation of this workflow ends the
    /// wait ([`StepError::Cancelled`]).
    ///
    /// # Errors
    ///
    /// [`StepError::InvalidEvent`] for an invalid key (nothing read);
    /// [`StepError::Failed`] with the [`ClientError`] when no shard has
    /// `workflow` ([`ClientError::NotFound`]) or its shard fails (nothing
    /// recorded: the next attempt waits again); `Cancelled`, `Fenced`,
    /// `Database` as for [`JobContext::step`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped during the wait, nothing is recorded, and the
    /// next run waits again.
    ///
    /// [`Client::get_event`]: crate::Client::get_event
    /// [`ClientError`]: crate::ClientError
    /// [`ClientError::NotFound`]: crate::ClientError::NotFound
    pub async fn get_event(
        &self,
        workflow: JobId,
        key: &str,
        timeout: Duration,
    ) -> Result<Option<Value>, StepError> {
        let name = get_event_step(self.get_events.fetch_add(1, Ordering::SeqCst) + 1);
        validate_event(key, None, 0).map_err(|reason| StepError::InvalidEvent {
            step: name.clone(),
            reason,
        })?;
        // Recorded as {"value": v}, or {} for the timeout: a JSON null
        // value is told apart from none.
        let got = self
            .step(&name, || async {
                let got = tokio::select! {
                    got = wait_for_event(&self.shards, workflow, key, timeout) => got,
                    _ = self.cancelled() => return Err("cancelled while waiting".into()),
                };
                let got = got.map_err(HandlerError::from)?;
                Ok(got.map_or_else(|| json!({}), |value| json!({ "value": value })))
            })
            .await;
        match got {
            Ok(recorded) => Ok(recorded.get("value").cloned()),
            Err(StepError::Failed { .. }) if self.is_cancelled() => {
                Err(StepError::Cancelled(self.id, name))
            }
            Err(e) => Err(e),
        }
    }
}
