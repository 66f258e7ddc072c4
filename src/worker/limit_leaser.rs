//! Renews this process's permits of limited queues on the limits' home
//! shard (the first of the list), every [`RENEW`] and when a producer
//! found none free (see `permits`).
//!
//! When the home shard does not answer within [`ASK_DEADLINE`], the
//! limits are read from the other shards instead: a queue they record no
//! limit for is claimed uncounted, so a sick home shard stops only the
//! limited queues, and those only once their lease lapsed ([`LEASE`]).
//!
//! An ask past its deadline may still commit on the home shard (a deadline
//! abandons the wait, not the statement), granting permits this process
//! never hears of. Until an answer comes it asks for no more than it uses
//! (`Permits::unanswered`; nothing, before any answer told it the limit)
//! and reserves no more than it asked for, so that the home shard's record
//! of it, renewed by each ask that arrives, converges to what it uses
//! instead of holding the rest of the limit away from the fleet. Its
//! answer is not awaited past the deadline: the next ask, which must go
//! out within the lease, supersedes it.

use super::permits::{Permits, LEASE, RENEW};
use crate::shards::ShardSet;
use crate::store;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Longest wait for one answer of a shard.
const ASK_DEADLINE: Duration = Duration::from_secs(1);

/// Shortest pause between two asks, however often producers find no
/// permit free (a queue at its limit would otherwise ask in a loop).
const MIN_GAP: Duration = Duration::from_millis(50);

/// Renews until `stop`; then gives every permit back (the process holds
/// no job any more).
pub(crate) async fn run(
    permits: Arc<Permits>,
    shards: ShardSet,
    holder: Arc<str>,
    batch: u32,
    stop: CancellationToken,
) {
    // A refusal for good is logged once until an ask succeeds again.
    let mut told = false;
    loop {
        if !ask(&permits, &shards, &holder, permits.wants(batch), &mut told).await {
            learn_unlimited(&permits, &shards).await;
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(MIN_GAP) => {}
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(RENEW - MIN_GAP) => {}
            _ = permits.starved.notified() => {}
        }
    }
    let none = permits.queues().into_iter().map(|q| (q, 0)).collect();
    ask(&permits, &shards, &holder, none, &mut told).await;
}

/// One ask of the home shard; whether it answered.
async fn ask(
    permits: &Permits,
    shards: &ShardSet,
    holder: &str,
    wants: Vec<(String, i32)>,
    told: &mut bool,
) -> bool {
    if wants.is_empty() || shards.is_empty() {
        return true;
    }
    let asked = Instant::now();
    let lease_ms = i32::try_from(LEASE.as_millis()).unwrap_or(i32::MAX);
    let home = shards.get(0);
    let answer = tokio::time::timeout(
        ASK_DEADLINE,
        store::limits::lease(home, holder, &wants, lease_ms),
    )
    .await;
    match answer {
        Ok(Ok(granted)) => {
            *told = false;
            permits.answered();
            for g in granted {
                let per_start = g.rate.map(|r| {
                    Duration::from_millis(u64::try_from(r.period_ms).unwrap_or(0))
                        / u32::try_from(r.count).unwrap_or(1).max(1)
                });
                permits.leased(&g.queue, g.concurrency, g.granted, per_start, asked);
            }
            return true;
        }
        Ok(Err(err)) if err.is_permanent() => {
            if !std::mem::replace(told, true) {
                tracing::error!(
                    shard = %home.name,
                    error = %crate::error_chain::error_chain(&err),
                    "cannot read the queue limits (a role without the grants of \
                     docs/least_privilege.sql, run it again after upgrading?): queues whose limits \
                     are unknown are not claimed"
                )
            }
        }
        Ok(Err(err)) => {
            if err.kind().may_have_run() {
                permits.unanswered();
            }
            tracing::warn!(
                shard = %home.name,
                error = %crate::error_chain::error_chain(&err),
                "cannot lease permits of limited queues from the limits' home shard"
            )
        }
        Err(_) => {
            permits.unanswered();
            tracing::warn!(shard = %home.name, "the limits' home shard did not answer a permit lease")
        }
    }
    false
}

/// The limits as the first other shard that answers records them: the
/// queues it records no limit for are claimed uncounted.
async fn learn_unlimited(permits: &Permits, shards: &ShardSet) {
    let queues = permits.queues();
    for shard in shards.all().iter().skip(1) {
        if let Ok(Ok(rows)) = tokio::time::timeout(ASK_DEADLINE, store::limits::read(shard)).await {
            for queue in &queues {
                let limited = rows
                    .iter()
                    .any(|r| &r.queue == queue && (r.concurrency.is_some() || r.rate.is_some()));
                if !limited {
                    permits.unlimited_elsewhere(queue);
                }
            }
            return;
        }
    }
}
