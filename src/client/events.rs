//! Workflow events: `Client::get_event`, and the wait that
//! `JobContext::get_event` shares with it.
//!
//! The wait polls the event's row, as `Client::result` polls a job's
//! outcome: the first look at once, then after a pause that doubles from
//! [`EVENT_POLL_FIRST`] to [`EVENT_POLL_MAX`], jittered. A poll cannot be
//! lost, so nothing a set_event commits is missed: a waiter sees it within
//! one pause. No `LISTEN`: a listening connection per waiting call would
//! hold a server backend for the whole wait (a shared listener per process
//! is the cheaper design, not built yet); one primary-key read every
//! quarter second per waiter costs the shard less than that.

use super::error::ClientError;
use super::handle::Client;
use super::inspect::find_in;
use crate::job::{validate_event, JobId};
use crate::shards::ShardSet;
use crate::store::events;
use rand::Rng;
use serde_json::Value;
use std::time::{Duration, Instant};

/// The first pause between two looks at an event not set yet: short, so a
/// set_event right after the call is seen at once.
const EVENT_POLL_FIRST: Duration = Duration::from_millis(10);

/// The longest pause between two looks: how late a waiter may see an
/// event, bounded; at four reads a second a waiter costs its shard little.
const EVENT_POLL_MAX: Duration = Duration::from_millis(250);

impl Client {
    /// The value workflow `workflow` published under `key`
    /// ([`JobContext::set_event`](crate::JobContext::set_event)), waiting
    /// up to `timeout` for it to be set: `Ok(None)` when it was not set by
    /// then. The first look is at once (a `timeout` of zero only looks).
    /// A value set during the wait is seen within a quarter second (the
    /// wait polls with a backoff up to that). An event stays readable
    /// after its workflow ends, until retention removes the workflow.
    ///
    /// # Errors
    ///
    /// [`ClientError::NotFound`] when no shard has this workflow (its id is
    /// wrong, or retention removed it); [`ClientError::InvalidEvent`] for
    /// an empty, oversized or NUL-holding key (nothing read);
    /// [`ClientError::Shard`] when its shard fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    pub async fn get_event(
        &self,
        workflow: JobId,
        key: &str,
        timeout: Duration,
    ) -> Result<Option<Value>, ClientError> {
        wait_for_event(&self.shards, workflow, key, timeout).await
    }
}

/// Waits up to `timeout` for event `key` of `workflow`, on the shard that
/// holds the workflow (found anew when a move took it elsewhere).
pub(crate) async fn wait_for_event(
    shards: &ShardSet,
    workflow: JobId,
    key: &str,
    timeout: Duration,
) -> Result<Option<Value>, ClientError> {
    validate_event(key, None, 0)
        .map_err(|reason| ClientError::InvalidEvent { workflow, reason })?;
    let started = Instant::now();
    let look = |shard| events::get(shard, workflow, key);
    let (mut shard, mut value) = find_in(shards, workflow, look)
        .await?
        .ok_or(ClientError::NotFound(workflow))?;
    let mut pause = EVENT_POLL_FIRST;
    loop {
        if value.is_some() {
            return Ok(value);
        }
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Ok(None);
        }
        let jittered = pause.mul_f64(rand::thread_rng().gen_range(0.5..=1.0));
        tokio::time::sleep(jittered.min(left)).await;
        pause = (pause * 2).min(EVENT_POLL_MAX);
        value = match look(shard).await? {
            Some(value) => value,
            // Moved by `shardq reshard` (written on its new shard before it
            // left this one), or removed by retention: look for it again.
            None => {
                (shard, value) = find_in(shards, workflow, look)
                    .await?
                    .ok_or(ClientError::NotFound(workflow))?;
                value
            }
        };
    }
}
