//! Messages to a workflow: `Client::send`, and the routing that
//! `JobContext::send` shares with it.

use super::error::ClientError;
use super::handle::Client;
use crate::job::{validate_message, JobId};
use crate::shards::ShardSet;
use crate::store::messages::{self, SendMessage, Sent};
use serde_json::Value;

impl Client {
    /// Sends `message` on `topic` to workflow `to`: it goes into the
    /// workflow's mailbox on its shard, where a `recv` of that topic
    /// ([`JobContext::recv`](crate::JobContext::recv)) takes it, oldest
    /// first (the shard's order of the sends), each message once. A
    /// workflow parked in a `recv` of the topic is woken. With an
    /// `idempotency_key`, a send whose key was used before for this
    /// workflow does nothing: sending again after an error or a lost reply
    /// delivers the message once.
    ///
    /// # Errors
    ///
    /// [`ClientError::SendRefused`] when no workflow has this id, or it
    /// has finished (succeeded, dead, cancelled) or is moving between
    /// shards: nothing is stored. [`ClientError::Shard`] when its shard
    /// fails (with a key, send again).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe without a key: dropped after the statement was
    /// sent, the message may be stored; with one, sending again is
    /// harmless.
    pub async fn send(
        &self,
        to: JobId,
        topic: &str,
        message: Value,
        idempotency_key: Option<&str>,
    ) -> Result<(), ClientError> {
        let max = self.limits.max_payload_bytes;
        send_routed(&self.shards, to, topic, &message, idempotency_key, max).await
    }
}

/// Sends to `to` on the shard its key routes to and, when that one has no
/// such workflow, on the others in turn, then on the routed one again (a
/// move may have copied it there meanwhile): a workflow written under an
/// older shard map stays where it was written. A message that
/// `validate_message` refuses (its payload over `max_payload_bytes`, say)
/// is sent nowhere.
pub(crate) async fn send_routed(
    shards: &ShardSet,
    to: JobId,
    topic: &str,
    message: &Value,
    idempotency_key: Option<&str>,
    max_payload_bytes: usize,
) -> Result<(), ClientError> {
    validate_message(topic, message, idempotency_key, max_payload_bytes)
        .map_err(|reason| ClientError::InvalidMessage { to, reason })?;
    let p = SendMessage {
        to,
        topic,
        message,
        idempotency_key,
    };
    let routed = shards.for_key(to.shard_key);
    let mut sent = messages::send(routed, p).await?;
    let mut failed = None;
    for shard in shards.all().iter().filter(|s| s.index != routed.index) {
        if sent != Sent::Missing {
            break;
        }
        match messages::send(shard, p).await {
            Ok(s) => sent = s,
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    if sent == Sent::Missing {
        sent = messages::send(routed, p).await?;
    }
    match sent {
        Sent::Written { .. } | Sent::Duplicate => Ok(()),
        Sent::Refused(status) => Err(ClientError::SendRefused {
            to,
            status: Some(status),
        }),
        Sent::Missing => match failed {
            Some(e) => Err(e.into()),
            None => Err(ClientError::SendRefused { to, status: None }),
        },
    }
}
