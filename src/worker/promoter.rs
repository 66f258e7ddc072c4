//! The promoter: on every shard, makes due scheduled jobs (delayed jobs,
//! retries, woken sleeps) ready when they fall due, not at the next
//! maintenance pass. After each pass it asks the shard how long until its
//! earliest scheduled job is due and sleeps that long: at least
//! [`PROMOTION_FLOOR`] (a due job another process is promoting, or whose
//! key is held, is asked about again no more often), at most
//! [`PROMOTION_CEILING`] or the maintenance interval if shorter (a job
//! scheduled after a pass, due sooner than the earliest one it saw, is
//! promoted at most that late). Promotion is gated per shard like
//! every upkeep duty (one process at a time does it; the others' attempts
//! cost one statement), and the promotion's notification wakes the
//! claimers. Each pass first settles the parents' wakes that children's
//! completions left to it (the parent's row was locked then:
//! `shardq_wake_parents`); the shard counts a pending one as due now.
//! Then it ends the workflows past their deadline (`NewJob::timeout`,
//! `store::deadlines`), gated by a lock of its own, and cancels their
//! children as `Client::cancel` does; the sleep also wakes for the
//! earliest deadline.

use super::per_shard::each_shard;
use crate::shards::ShardSet;
use crate::store::{cancel_cascade, cascade_debts, children, deadlines, upkeep};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The shortest pause between two promotion passes on a shard.
pub(crate) const PROMOTION_FLOOR: Duration = Duration::from_millis(50);

/// The longest pause between two promotion passes on a shard.
const PROMOTION_CEILING: Duration = Duration::from_secs(1);

/// Jobs promoted per statement; a pass repeats while statements come back
/// full.
const PROMOTION_BATCH: i64 = 5_000;

/// Parents' wakes settled per statement: almost always none are pending
/// (a wake is left here only when the parent's row was locked at the
/// child's completion); a pass repeats while statements come back full.
const PARENT_WAKE_BATCH: i32 = 1_000;

/// Workflows ended per deadline statement: bounds its row and key locks
/// (each a lock-table entry until commit); a pass repeats while
/// statements come back full.
const DEADLINE_BATCH: i64 = 1_000;

/// Runs until shutdown: one loop per shard, passes at most `interval`
/// (`worker.maintenance_interval`) or [`PROMOTION_CEILING`] apart.
pub(crate) async fn run(interval: Duration, shards: ShardSet, shutdown: CancellationToken) {
    let every = interval.clamp(PROMOTION_FLOOR, PROMOTION_CEILING);
    each_shard(shards.len(), |index| {
        promote_loop(shards.clone(), index, every, shutdown.clone())
    })
    .await;
}

async fn promote_loop(
    shards: ShardSet,
    index: usize,
    every: Duration,
    shutdown: CancellationToken,
) {
    let shard = shards.get(index);
    loop {
        let mut woken = i64::from(PARENT_WAKE_BATCH);
        while woken >= i64::from(PARENT_WAKE_BATCH) {
            woken = match children::wake_pending(shard, PARENT_WAKE_BATCH).await {
                Ok(n) => n,
                Err(err) => {
                    super::maintenance::failed(shard, "wakes of parent workflows", &err);
                    0
                }
            };
        }
        let mut promoted = PROMOTION_BATCH as u64;
        while promoted >= PROMOTION_BATCH as u64 {
            promoted = match upkeep::promote_due(shard, PROMOTION_BATCH).await {
                Ok(n) => n,
                Err(err) => {
                    super::maintenance::failed(shard, "promotion of due jobs", &err);
                    0
                }
            };
        }
        end_past_deadlines(&shards, index).await;
        let pause = match upkeep::next_due(shard).await {
            Ok(Some(due)) => due.clamp(PROMOTION_FLOOR, every),
            Ok(None) | Err(_) => every,
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// Ends the workflows on `shard` past their deadline, batch by batch, and
/// cancels the children of each (but abandoned ones) as `Client::cancel`
/// does. A failure is logged and left to the next pass.
async fn end_past_deadlines(shards: &ShardSet, index: usize) {
    let shard = shards.get(index);
    // Repeats while a statement ended a full batch: rows it found and left
    // (key held) are found again by the next pass, not in a loop here.
    match deadlines::any_past_deadline(shard).await {
        Ok(true) => {}
        Ok(false) => return,
        Err(err) => {
            super::maintenance::failed(shard, "ending workflows past their deadline", &err);
            return;
        }
    }
    let mut ended = DEADLINE_BATCH as usize;
    while ended >= DEADLINE_BATCH as usize {
        let pass = match deadlines::end_past_deadline(shard, DEADLINE_BATCH).await {
            Ok(pass) => pass,
            Err(err) => {
                super::maintenance::failed(shard, "ending workflows past their deadline", &err);
                return;
            }
        };
        ended = pass.ended.len();
        // In a task of its own: a child on a shard that hangs must not hold
        // back this shard's promotions.
        let (shards, parents, owed) = (shards.clone(), pass.ended, pass.owed);
        tokio::spawn(async move {
            let duty = "cancelling children of ended workflows";
            match cancel_cascade::cancel_descendants(&shards, index, &parents).await {
                Ok(cascaded) if cascaded.complete => {
                    // Else the cascades stay owed: the maintenance pass runs them.
                    let debts: Vec<_> = parents.iter().map(|p| (*p, owed)).collect();
                    if let Err(err) = cascade_debts::paid(shards.get(index), &debts).await {
                        super::maintenance::failed(shards.get(index), duty, &err);
                    }
                }
                Ok(_) => {}
                Err(err) => super::maintenance::failed(shards.get(index), duty, &err),
            }
        });
    }
}
