//! A claim as a task of its own, so that a producer can stop waiting for it
//! at its shard's budget without dropping it (a claim that committed would
//! strand its jobs as running).

use super::producers::Producers;
use super::target::Target;
use crate::config::DequeueMode;
use crate::shards::ShardError;
use crate::store::jobs::{self, Claim, ClaimParams};
use crate::store::ErrorKind;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// A claim of target `target` in a task of its own, so that a producer can
/// stop waiting for it without dropping it.
pub(crate) fn spawn_claim(
    p: &Arc<Producers>,
    target: usize,
    mode: DequeueMode,
    limit: u32,
) -> JoinHandle<Result<Claim, ShardError>> {
    let p = p.clone();
    tokio::spawn(async move {
        let Target {
            shard: shard_index,
            queue,
        } = &p.targets[target];
        let params = ClaimParams {
            queue,
            limit,
            owner: &p.run.owner,
            lease: p.config.lease,
            mode,
        };
        jobs::claim(p.run.shards.get(*shard_index), params).await
    })
}

/// The value of a finished task; its panic goes on in the caller.
pub(crate) fn joined<T>(result: Result<T, tokio::task::JoinError>) -> T {
    result.unwrap_or_else(|err| std::panic::resume_unwind(err.into_panic()))
}

/// Whether a claim's failure is its shard's (the server or the way to it),
/// not its target's: then every producer skips the shard until its probe
/// answers. A lock timeout or a cancelled statement is about one queue's
/// rows; a data error about one statement.
pub(crate) fn fails_the_shard(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::NoAnswer | ErrorKind::Unreachable | ErrorKind::Other
    )
}

/// After `took`, whether the shard answered a claim whose result is
/// `result`: a failure that is the statement's (a lock timeout) is an
/// answer too.
pub(crate) fn answered(result: &Result<Claim, ShardError>, took: Duration) -> Option<Duration> {
    match result {
        Err(err) if fails_the_shard(err.kind()) => None,
        _ => Some(took),
    }
}
