//! `ctx.send` on a handler's context: a message to another workflow, on
//! this shard or another, exactly once per call. A recipient's shard that
//! does not take it parks the sender for a few seconds instead of failing
//! its attempt ([`super::unreachable`]): the unrecorded step is the outbox,
//! and the replay sends again under the same key.

use super::context::{HandlerError, JobContext, StepError};
use super::unreachable;
use crate::client::messages::send_routed;
use crate::client::ClientError;
use crate::job::{JobId, JobStatus};
use serde_json::Value;
use std::sync::atomic::Ordering;

/// The step name of a workflow's `n`th message sent (from 1).
fn send_step(n: u32) -> String {
    format!("shardq:send:{n}")
}

/// Whether a send's failure passes by itself: the recipient's shard not
/// answering (a transient [`ClientError::Shard`], or found silent) or
/// the recipient being moved between shards (refused as `held`), not a
/// refusal for good or an invalid message.
fn undelivered(err: &HandlerError) -> bool {
    if err.is::<unreachable::ShardSilent>() {
        return true;
    }
    match err.downcast_ref::<ClientError>() {
        Some(ClientError::Shard(e)) => unreachable::passes_by_itself(e),
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
    /// the sends to it. A shard this worker's claims found silent is not
    /// tried, and a send in flight when they find it so is left to finish
    /// in the background: the sender parks at once, its slot free for
    /// others.
    ///
    /// # Errors
    ///
    /// [`StepError::Unreachable`] (park); [`StepError::Failed`] with the
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
                let call = {
                    let (shards, topic, message) =
                        (self.shards.clone(), topic.to_string(), message.clone());
                    let (key, max) = (key.clone(), self.max_message_bytes);
                    async move { send_routed(&shards, to, &topic, &message, Some(&key), max).await }
                };
                self.unless_silent(self.shards.for_key(to.shard_key), call)
                    .await?
                    .map_err(HandlerError::from)?;
                Ok(serde_json::json!({ "to": to.to_string(), "topic": topic }))
            })
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(StepError::Failed { step, source }) if undelivered(&source) => {
                Err(self.park_unreachable(step, to.shard_key, source).await)
            }
            Err(e) => Err(e),
        }
    }
}
