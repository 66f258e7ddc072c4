//! Settling a claim's reply, on time or late, in one place.

use super::claim_task::answered;
use super::producers::Producers;
use super::rate_starts::give_back_starts;
use super::target::Target;
use crate::shards::ShardError;
use crate::store::jobs::Claim;
use std::time::Duration;

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
