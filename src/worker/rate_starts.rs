//! Starts of rate-limited queues, taken from the limits' home shard before
//! a claim and given back when the claim does not use them.

use super::claim_task::joined;
use super::producers::Producers;
use super::shard_health::SUSPECT_RECHECK;
use crate::config::Backoff;
use crate::store;
use std::time::{Duration, Instant};

/// How soon a target whose queue's rate gave no start is visited again:
/// after half a start's time, within these bounds (at high rates a take
/// waits for half the rate's 50 ms burst, so sooner finds nothing).
const RATE_RECHECK: Backoff = Backoff {
    min: Duration::from_millis(10),
    max: Duration::from_millis(500),
};

/// Up to `want` starts of rate-limited `queue` (one start per `per_start`)
/// from the limits' home shard: `Ok(None)` when the queue has no rate any
/// more; `Err(until)` when none is free (until about one comes back), or
/// the home shard is skipped as suspect or does not answer within its
/// budget.
pub(crate) async fn take_starts(
    p: &Producers,
    queue: &str,
    want: u32,
    per_start: Duration,
) -> Result<Option<u32>, Instant> {
    // A home shard the producers skip is not waited on for each claim.
    if !p.run.health.usable(0) {
        return Err(Instant::now() + SUSPECT_RECHECK);
    }
    let home = p.run.shards.get(0).clone();
    let want = i32::try_from(want).unwrap_or(i32::MAX);
    let budget = p.run.health.budget(0);
    let mut take = {
        let (home, queue) = (home.clone(), queue.to_string());
        tokio::spawn(async move { store::limits::take_starts(&home, &queue, want).await })
    };
    let taken = match tokio::time::timeout(budget, &mut take).await {
        Ok(joined_take) => joined(joined_take),
        Err(_) => {
            // Past its budget: the starts it takes, when it answers, go
            // back (else they would be lost to the rate).
            let queue = queue.to_string();
            p.spawn(async move {
                if let Ok(Ok(Some(n))) = take.await {
                    if n > 0 {
                        let _ = store::limits::take_starts(&home, &queue, -n).await;
                    }
                }
            });
            return Err(Instant::now() + SUSPECT_RECHECK);
        }
    };
    let now = Instant::now();
    match taken {
        Ok(None) => Ok(None),
        Ok(Some(n)) if n > 0 => Ok(Some(u32::try_from(n).unwrap_or(0))),
        Ok(Some(_)) => Err(now + (per_start / 2).clamp(RATE_RECHECK.min, RATE_RECHECK.max)),
        Err(err) => {
            tracing::warn!(
                shard = %home.name,
                %queue,
                error = %crate::error_chain::error_chain(&err),
                "cannot take starts of a rate-limited queue from the limits' home shard"
            );
            Err(now + SUSPECT_RECHECK)
        }
    }
}

/// Gives `n` unused starts of `queue` back to its rate, in the background.
pub(crate) fn give_back_starts(p: &Producers, queue: &str, n: u32) {
    if n == 0 {
        return;
    }
    let home = p.run.shards.get(0).clone();
    let queue = queue.to_string();
    let n = -i32::try_from(n).unwrap_or(i32::MAX);
    p.spawn(async move {
        let _ = store::limits::take_starts(&home, &queue, n).await;
    });
}
