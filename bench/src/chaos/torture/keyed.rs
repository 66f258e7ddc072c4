//! The torture workload. Job `n`'s kind follows from `n % 10`: slots 0 and 5
//! are the chaos workflows (so [`super::super::names::is_workflow`] still
//! holds), slots 1 and 2 use one of [`HOT_KEYS`] keys in the first and the
//! second queue (the same key strings in both), slot 9 is a workflow that
//! waits ([`super::waits`]), the other five slots use cold keys, each one in
//! turn, so that a run has as many distinct keys as it has
//! cold jobs (up to `keys`). Some keyed jobs are delayed a few hundred ms
//! (promoted by maintenance), and the first attempt of one job in ten fails.

use super::super::names::{is_workflow, QUEUE, TORTURE_QUEUE, WORKFLOW_HANDLER};
use super::super::sql;
use super::waits;
use shardq::shards::ShardSet;
use shardq::worker::HandlerResult;
use shardq::{JobContext, NewJob};
use std::time::Duration;

/// The keyed handler: logs the start and the finish of each attempt.
pub const HANDLER: &str = "torture.keyed";

/// Keys shared by many jobs (slots 1 and 2), so that each is held, parked,
/// retried and released many times during the run.
pub const HOT_KEYS: u64 = 64;

/// Slots of `n % 10` with a cold key (slot 9 is a waiting workflow:
/// [`super::waits`]).
const COLD_SLOTS: [u64; 5] = [3, 4, 6, 7, 8];

/// One job in this many (by `n / 7`) is delayed.
const DELAYED_EVERY: u64 = 8;
/// Shortest delay of a delayed job: several promotion passes (50 ms) away.
const DELAY_MIN_MS: u64 = 200;
/// Spread of the delays above the shortest.
const DELAY_SPREAD_MS: u64 = 300;

/// Time a keyed attempt spends between its start and its finish, so that two
/// runs of one key that overlapped would show.
const WORK: Duration = Duration::from_millis(2);

/// Whether job `n`'s first attempt fails by design (one job in ten, spread
/// over every slot: the decade's digit picks the slot).
pub fn fails_first_attempt(n: u64) -> bool {
    (n / 10) % 10 == n % 10
}

/// Job `n` of the torture workload, cold keys taken from `keys`.
pub fn new_job(n: u64, keys: u64) -> NewJob {
    let payload = serde_json::json!({ "n": n });
    if is_workflow(n) {
        return NewJob::new(QUEUE, WORKFLOW_HANDLER, payload);
    }
    let slot = n % 10;
    let decade = n / 10;
    if waits::is_waiting(n) {
        let queue = if decade % 2 == 0 {
            QUEUE
        } else {
            TORTURE_QUEUE
        };
        return waits::new_job(n, queue);
    }
    let (queue, key) = match COLD_SLOTS.iter().position(|&s| s == slot) {
        None => {
            let queue = if slot == 1 { QUEUE } else { TORTURE_QUEUE };
            (queue, format!("t-h{}", decade % HOT_KEYS))
        }
        Some(index) => {
            let cold = decade * COLD_SLOTS.len() as u64 + index as u64;
            let queue = if cold % 2 == 0 { QUEUE } else { TORTURE_QUEUE };
            (queue, format!("t-c{}", cold % keys.max(1)))
        }
    };
    let job = NewJob::new(queue, HANDLER, payload).ordering_key(key);
    if (n / 7) % DELAYED_EVERY == 0 {
        job.delay(Duration::from_millis(DELAY_MIN_MS + n % DELAY_SPREAD_MS))
    } else {
        job
    }
}

/// The keyed handler: records the attempt's start, works briefly, records
/// its finish, then fails if this attempt fails by design. A failed record
/// fails the attempt (it is retried), so a succeeded job always has the
/// finished run of its last attempt.
pub async fn run(shards: ShardSet, ctx: JobContext) -> HandlerResult {
    let n = ctx.payload["n"]
        .as_u64()
        .ok_or("the payload has no number n")?;
    let key = ctx
        .ordering_key
        .clone()
        .ok_or("a keyed job without a key")?;
    let by_design = ctx.attempt == 1 && fails_first_attempt(n);
    let shard = shards.for_key(ctx.id.shard_key).clone();
    let db = shard.client().await?;
    let run: i64 = db
        .query_one(
            sql::RUN_START,
            &[
                &ctx.queue,
                &key,
                &ctx.id.shard_key,
                &ctx.id.id,
                &ctx.attempt,
                &by_design,
                &(std::process::id() as i32),
            ],
        )
        .await
        .map_err(|e| shard.query_error(e))?
        .get(0);
    tokio::time::sleep(WORK).await;
    db.execute(sql::RUN_FINISH, &[&run])
        .await
        .map_err(|e| shard.query_error(e))?;
    if by_design {
        return Err(format!("job n={n} {}", sql::BY_DESIGN_MARK).into());
    }
    Ok(serde_json::json!({ "attempt": ctx.attempt }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_has_both_queues_shared_keys_failures_and_delays() {
        let jobs: Vec<NewJob> = (0..10_000).map(|n| new_job(n, 1_000_000)).collect();
        let keyed: Vec<&NewJob> = jobs.iter().filter(|j| j.handler == HANDLER).collect();
        assert_eq!(keyed.len(), 7_000, "7 of every 10 jobs are keyed");
        let waiting = jobs.iter().filter(|j| j.handler == waits::HANDLER).count();
        assert_eq!(waiting, 1_000, "1 of every 10 jobs waits");
        let in_b = keyed.iter().filter(|j| j.queue == TORTURE_QUEUE).count();
        assert!(in_b > 2_500 && in_b < 4_500, "{in_b} keyed jobs in queue b");
        let hot_in = |queue: &str| {
            keyed
                .iter()
                .filter(|j| j.queue == queue)
                .filter_map(|j| j.ordering_key.clone())
                .filter(|k| k.starts_with("t-h"))
                .collect::<std::collections::HashSet<_>>()
        };
        assert_eq!(
            hot_in(QUEUE),
            hot_in(TORTURE_QUEUE),
            "hot keys in both queues"
        );
        assert_eq!(hot_in(QUEUE).len() as u64, HOT_KEYS);
        let distinct: std::collections::HashSet<_> = keyed
            .iter()
            .filter_map(|j| j.ordering_key.clone())
            .collect();
        assert_eq!(
            distinct.len(),
            5_000 + HOT_KEYS as usize,
            "every cold job its own key"
        );
        let failing = (0..10_000u64)
            .filter(|&n| !is_workflow(n) && !waits::is_waiting(n) && fails_first_attempt(n))
            .count();
        assert!((600..=800).contains(&failing), "{failing} failing jobs");
        let delayed = keyed.iter().filter(|j| !j.delay.is_zero()).count();
        assert!(delayed > 500 && delayed < 2_000, "{delayed} delayed jobs");
        let few_keys: std::collections::HashSet<_> = (0..10_000)
            .map(|n| new_job(n, 100))
            .filter_map(|j| j.ordering_key)
            .collect();
        assert_eq!(
            few_keys.len(),
            100 + HOT_KEYS as usize,
            "cold keys wrap at `keys`"
        );
    }
}
