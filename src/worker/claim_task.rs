//! A claim as a task of its own, so that a producer can stop waiting for it
//! at its shard's budget without dropping it (a claim that committed would
//! strand its jobs as running).

use super::producers::Producers;
use super::target::Target;
use crate::config::DequeueMode;
use crate::shards::ShardError;
use crate::store::jobs::{self, Claim, ClaimParams};
use std::sync::Arc;
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

/// A claim's result with a held-back claim as a plain one, and whether it
/// was held back.
pub(crate) fn unheld(result: Result<Claim, ShardError>) -> (Result<Claim, ShardError>, bool) {
    match result {
        Ok(claim) => {
            let (claim, held_back) = claim.unheld();
            (Ok(claim), held_back)
        }
        Err(err) => (Err(err), false),
    }
}
