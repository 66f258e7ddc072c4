//! `ctx.send` on a handler's context: a message to another workflow, on
//! this shard or another, exactly once per call. A recipient's shard that
//! does not take it parks the sender for a few seconds instead of failing
//! its attempt: the unrecorded step is the outbox, and the replay sends
//! again under the same key.

use super::context::{HandlerError, JobContext, StepError};
use crate::client::messages::send_routed;
use crate::client::ClientError;
use crate::job::{JobId, JobStatus};
use crate::store::steps;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How soon a sender parked by a recipient's shard that did not answer
/// sends again (less up to a fifth, spread by the shard).
const SEND_RETRY: Duration = Duration::from_secs(5);

/// The step name of a workflow's `n`th message sent (from 1).
fn send_step(n: u32) -> String {
    format!("shardq:send:{n}")
}

/// A send not tried: this process's claims found the recipient's shard
/// silent, and a statement there would hold the sender's slot until its
/// deadline.
#[derive(Debug, thiserror::Error)]
#[error("shard `{0}` does not answer this worker (its claims there went unanswered); the send was not tried")]
struct ShardSilent(String);

/// Whether a send's failure passes by itself: the recipient's shard not
/// answering (a transient [`ClientError::Shard`], or [`ShardSilent`]) or
/// the recipient being moved between shards (refused as `held`), not a
/// refusal for good or an invalid message.
fn undelivered(err: &HandlerError) -> bool {
    if err.is::<ShardSilent>() {
        return true;
    }
    match err.downcast_ref::<ClientError>() {
        Some(ClientError::Shard(e)) => !e.is_permanent(),
        Some(ClientError::SendRefused { status, .. }) => *status == Some(JobStatus::Held),
        _ => false,
    }
}

impl JobContext {
    /// Sends `message` on `topic` to workflow `to` ([`Client::send`]),
    /// exactly once per workflow: the send is a step named `shardq:send:N`
    /// (N counting this run's sends from 1, so the code must reach its
    /// sends in the same order on every run), and its idempotency key is
    /// `{this workflow's id}:shardq:send:N`, so a replay, or a retry after
    /// the send was stored but before its step was recorded, stores
    /// nothing again.
    ///
    /// When `to`'s shard does not take the message (it does not answer,
    /// restarts, passes its statement deadline, or `to`'s key range is
    /// being moved), this workflow parks for about five seconds and sends
    /// again then: no attempt is spent, and a sick shard holds back only
    /// the sends to it. A shard this worker's claims already found silent
    /// is not tried: the sender parks at once, its slot free for others.
    ///
    /// # Errors
    ///
    /// [`StepError::Undelivered`] (park); [`StepError::Failed`] with the
    /// [`ClientError`] of a refusal (`to` does not exist or has finished)
    /// or an invalid message; `Cancelled`, `Fenced`, `Database` as for
    /// [`JobContext::step`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: the key makes a repeat store nothing.
    ///
    /// [`Client::send`]: crate::Client::send
    pub async fn send(&self, to: JobId, topic: &str, message: Value) -> Result<(), StepError> {
        let name = send_step(self.sends.fetch_add(1, Ordering::SeqCst) + 1);
        let key = format!("{}:{name}", self.id);
        // Through the client's routing, on the recipient's shard (this
        // workflow's own or another), with the derived key; the step is
        // recorded after, on this workflow's shard: two transactions even
        // when the shards are one, which the key makes exactly once.
        let sent = self
            .step(&name, || async {
                let routed = self.shards.for_key(to.shard_key);
                if self.answers.silent(routed.index) {
                    return Err(ShardSilent(routed.name.clone()).into());
                }
                let max = self.max_message_bytes;
                send_routed(&self.shards, to, topic, &message, Some(&key), max)
                    .await
                    .map_err(HandlerError::from)?;
                Ok(serde_json::json!({ "to": to.to_string(), "topic": topic }))
            })
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(StepError::Failed { step, source }) if undelivered(&source) => {
                self.park_undelivered(step, to, source).await
            }
            Err(e) => Err(e),
        }
    }

    /// Parks this workflow to send again soon: its `run_at` moves to
    /// [`SEND_RETRY`] from now, for the `parked` outcome to keep.
    async fn park_undelivered(
        &self,
        step: String,
        to: JobId,
        source: HandlerError,
    ) -> Result<(), StepError> {
        match steps::run_again_in(&self.shard, self.id, &self.owner, self.fence, SEND_RETRY).await {
            Ok(true) => {
                tracing::warn!(job = %self.id, %to, error = %source, "the recipient's shard did not take the message: parked, to send again soon");
                self.parked.store(true, Ordering::SeqCst);
                Err(StepError::Undelivered { step, to, source })
            }
            Ok(false) => Err(StepError::Fenced(self.id, step)),
            Err(source) => Err(StepError::Database { step, source }),
        }
    }
}
