//! A claim as a task of its own, so that a producer can stop waiting for it
//! at its shard's budget without dropping it (a claim that committed would
//! strand its jobs as running).

use super::producers::Producers;
use super::rate_starts::give_back_starts;
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

/// When a claim's reply came, for [`settle`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reply {
    /// Within its shard's budget.
    OnTime,
    /// Past it, to the task that waited for it ([`super::late_reply`]).
    Late,
}

/// What every claim's reply settles, on time or late, in one place: the
/// claim's statistics, its shard's health (a last-resort claim ends; an
/// answer counts, late or not; a late failure counts against the shard,
/// while an on-time one is the producer's to judge), and the starts of a
/// rate (`starts`) that its jobs did not use go back.
pub(crate) fn settle(
    p: &Producers,
    target: usize,
    result: &Result<Claim, ShardError>,
    took: Duration,
    reply: Reply,
    last_resort: bool,
    starts: Option<u32>,
) {
    let Target { shard, queue } = &p.targets[target];
    p.run.stats.record_claim(*shard, target, result, took);
    p.run.health.with(*shard, |h| {
        match (last_resort, reply, answered(result, took)) {
            (true, _, answered) => h.last_resort_ended(answered),
            (false, Reply::OnTime, _) if result.is_ok() => h.answered(took),
            (false, Reply::OnTime, _) => {}
            (false, Reply::Late, Some(took)) => h.answered_late(took),
            (false, Reply::Late, None) => h.late_failed(),
        }
    });
    if let Some(starts) = starts {
        let used = result.as_ref().map_or(0, |claim| claim.jobs().len()) as u32;
        give_back_starts(p, queue, starts.saturating_sub(used));
    }
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
