//! A call from a workflow to another shard that does not answer (down,
//! frozen, restarting, or the key's range being moved) parks the workflow
//! for a few seconds instead of failing its attempt: what it had not
//! recorded it does again when it runs next, each write idempotent, so an
//! outage spends no attempt and holds no slot. A shard this process's
//! claims already found silent is not tried at all, and a call in flight
//! when they find it so is left to a task of its own: a statement there
//! would hold the slot until its deadline.

use super::context::{HandlerError, JobContext, StepError};
use crate::shards::{Shard, ShardError};
use crate::store::steps;
use crate::store::ErrorKind;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tracing::Instrument;

/// How soon a workflow parked by a shard that did not answer runs again
/// at first (less up to a fifth, spread by the shard).
pub(crate) const RETRY: Duration = Duration::from_secs(5);

/// The longest a workflow parked by a shard that does not answer waits
/// before it tries again.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(30);

/// How soon a workflow parked by a shard that this process has found not
/// answering for `unanswering_for` tries again: [`RETRY`], then half the
/// outage so far, at most [`RETRY_MAX`]. Over a long outage each parked
/// workflow costs its shard a claim every 30 s, not every 5 (ten thousand
/// senders to a shard down for an hour: 333 claims a second, not 2,000),
/// and the end of one is noticed within half its length.
pub(crate) fn retry_after(unanswering_for: Duration) -> Duration {
    (unanswering_for / 2).clamp(RETRY, RETRY_MAX)
}

/// Whether a call to another shard that failed with `err` may pass by
/// itself, so that parking and calling again is right: no answer, no
/// connection, a deadline, a lock held, a route refused by a map that
/// moved on, a server restarting or out of connections, a conflict. Not a
/// statement that would fail the same way again (its data, a missing
/// function or permission on a shard not migrated): that fails the attempt,
/// where it shows.
pub(crate) fn passes_by_itself(err: &ShardError) -> bool {
    match err.kind() {
        ErrorKind::NoAnswer
        | ErrorKind::Unreachable
        | ErrorKind::QueryCanceled
        | ErrorKind::LockNotAvailable
        | ErrorKind::StaleMap => true,
        ErrorKind::Other => err.sqlstate().is_some_and(|state| {
            let code = state.code();
            code.starts_with("08")
                || code.starts_with("57P")
                || matches!(code, "53300" | "40001" | "40P01" | "SQ001")
        }),
        _ => false,
    }
}

/// A call not tried: this process's claims found the shard silent.
#[derive(Debug, thiserror::Error)]
#[error("shard `{0}` does not answer this worker (its claims there went unanswered); not tried")]
pub(crate) struct ShardSilent(String);

impl JobContext {
    /// Whether `shard` may be asked: not when this process's claims found
    /// it silent.
    pub(crate) fn answering(&self, shard: &Shard) -> Result<(), ShardSilent> {
        match self.answers.silent(shard.index) {
            true => Err(ShardSilent(shard.name.clone())),
            false => Ok(()),
        }
    }

    /// Runs `call` to `shard` unless that shard is, or falls, silent first
    /// (this process's claims there go unanswered): the call then goes on
    /// in a task of its own until its deadline, and may still commit, so
    /// it must be idempotent; the handler's slot is freed at once.
    pub(crate) async fn unless_silent<T: Send + 'static>(
        &self,
        shard: &Shard,
        call: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, ShardSilent> {
        self.answering(shard)?;
        let mut task = tokio::spawn(call.in_current_span());
        tokio::select! {
            done = &mut task => match done {
                Ok(value) => Ok(value),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // Cancelled: the runtime shuts down.
                Err(_) => Err(ShardSilent(shard.name.clone())),
            },
            () = self.answers.until_silent(shard.index) => Err(ShardSilent(shard.name.clone())),
        }
    }

    /// Parks this workflow to run again in about [`retry_after`] the time
    /// the shard of `shard_key` has not answered this process: its `run_at`
    /// moves there, for the `parked` outcome to keep. Returns the error
    /// the handler must return: [`StepError::Unreachable`], or `Fenced`
    /// when this claim no longer holds the workflow.
    pub(crate) async fn park_unreachable(
        &self,
        step: String,
        shard_key: i32,
        source: HandlerError,
    ) -> StepError {
        let there = self.shards.for_key(shard_key).index;
        let after = retry_after(self.answers.unanswering_for(there));
        match steps::run_again_in(&self.shard, self.id, &self.owner, self.fence, after).await {
            Ok(true) => {
                tracing::warn!(job = %self.id, shard_key, error = %source, ?after, "another shard did not answer: parked, to try again");
                self.parked.store(true, Ordering::SeqCst);
                StepError::Unreachable {
                    step,
                    shard_key,
                    source,
                }
            }
            Ok(false) => StepError::Fenced(self.id, step),
            Err(source) => StepError::Database { step, source },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_longer_outage_parks_longer_up_to_the_ceiling() {
        let s = Duration::from_secs;
        assert_eq!(retry_after(Duration::ZERO), RETRY);
        assert_eq!(retry_after(s(8)), RETRY, "half of 8 s is below the floor");
        assert_eq!(retry_after(s(24)), s(12));
        assert_eq!(retry_after(s(3600)), RETRY_MAX);
    }
}
