//! The torture run's workflows that wait: one job in ten (slot 9 of
//! `n % 10`) sleeps durably, receives messages the driver sends
//! ([`super::mail`]) on a few topics, starts children keyed over every
//! shard and gathers their results, receives the message each child sent
//! it ([`KIDS_TOPIC`], mostly from another shard), and records side
//! effects around them. One in fifty of them fans out to
//! [`FAN_OUT_CHILDREN`] children. What each records is what
//! [`super::waits_check`] checks after the drain.

use super::waits_sql as sql;
use shardq::shards::{Shard, ShardSet};
use shardq::worker::{HandlerError, HandlerResult};
use shardq::{ChildResult, JobContext, JobId, NewJob};
use std::time::Duration;

/// The waiting workflow's handler.
pub const HANDLER: &str = "torture.waits";

/// The children's handler.
pub const CHILD_HANDLER: &str = "torture.child";

pub use super::super::names::CHILD_QUEUE;

/// The slot of `n % 10` that is a waiting workflow.
const SLOT: u64 = 9;

/// Shortest durable sleep: several promotion passes (50 ms) away.
const SLEEP_MIN_MS: u64 = 200;
/// Spread of the sleeps above the shortest.
const SLEEP_SPREAD_MS: u64 = 300;

/// Children most workflows start and gather.
const CHILDREN: u64 = 3;

/// Children of a fan-out workflow ([`children`]).
pub const FAN_OUT_CHILDREN: u64 = 100;

/// One waiting workflow in this many (by `n / 10`) fans out.
const FAN_OUT_EVERY: u64 = 50;

/// The topic on which each child sends its parent one message
/// (`ctx.send`, from the child's shard) before it returns; the parent
/// receives them all after gathering.
pub const KIDS_TOPIC: &str = "kids";

/// How long the parent's recv of a child's message waits: each was sent
/// before its child finished, so the parent finds them waiting.
const KIDS_TIMEOUT: Duration = Duration::from_secs(30);

/// A topic of the mailbox: its name, how many messages the driver sends on
/// it (and the workflow receives), when the driver sends them (after the
/// enqueue was acknowledged), and the recv's timeout.
#[derive(Debug, Clone, Copy)]
pub struct Topic {
    /// Its name.
    pub name: &'static str,
    /// Messages sent on it, and recvs of it.
    pub messages: usize,
    /// The driver's delay for job `n`, after the acknowledgement.
    pub delay: fn(u64) -> Duration,
    /// Each recv's timeout.
    pub timeout: Duration,
}

/// The topics, in the order the workflow receives them. `early` is sent
/// at once (usually before the workflow parks on it: it sleeps first),
/// `late` after the workflow has usually parked on it, `racy` either well
/// before its short timeout or well after it, so that the timeout fires
/// for about half the workflows and their message stays in the mailbox
/// (or is refused: the workflow may have finished). Well after: 8 s, for
/// the timeout to fire the workflow must park on `racy` within 7 s of its
/// acknowledgement, past `late` (1.5 s) and a wake; at 4 s a slow run
/// (kills, stalls, two cores shared) had none park in time, and the
/// run's check that some timeout fired failed. The long timeouts
/// also end the waits of workflows whose enqueue was not acknowledged
/// (the driver never learnt their ids).
pub const TOPICS: [Topic; 3] = [
    Topic {
        name: "early",
        messages: 2,
        delay: |_| Duration::ZERO,
        timeout: Duration::from_secs(5),
    },
    Topic {
        name: "late",
        messages: 1,
        delay: |_| Duration::from_millis(1_500),
        timeout: Duration::from_secs(5),
    },
    Topic {
        name: "racy",
        messages: 1,
        delay: |n| Duration::from_millis(if (n / 10) % 2 == 0 { 100 } else { 8_000 }),
        timeout: Duration::from_secs(1),
    },
];

/// Whether job `n` is a waiting workflow.
pub fn is_waiting(n: u64) -> bool {
    n % 10 == SLOT
}

/// Job `n`, a waiting workflow, in one of the two queues.
pub fn new_job(n: u64, queue: &'static str) -> NewJob {
    NewJob::new(queue, HANDLER, serde_json::json!({ "n": n }))
}

/// How many children waiting workflow `n` starts and gathers.
pub fn children(n: u64) -> u64 {
    if (n / 10) % FAN_OUT_EVERY == 0 {
        FAN_OUT_CHILDREN
    } else {
        CHILDREN
    }
}

/// The ordering key of child `i` of workflow `n`: its own, so the
/// children spread over every shard (most on another than the parent's).
pub fn child_key(n: u64, i: u64) -> String {
    format!("kid-{n}-{i}")
}

/// What child `i` of workflow `n` returns (and its parent must gather).
pub fn child_value(n: u64, i: u64) -> u64 {
    n * 10 + i
}

/// The waiting workflow: a side effect, a durable sleep and a step that
/// records the run that passed it, the recvs of [`TOPICS`], children
/// started and gathered, a side effect that records their results, and
/// the recvs of the children's messages ([`KIDS_TOPIC`]).
/// Every wait parks (`?`), and the next run replays up to it.
pub async fn run(shards: ShardSet, ctx: JobContext) -> HandlerResult {
    let n = ctx.payload["n"]
        .as_u64()
        .ok_or("the payload has no number n")?;
    let shard = shards.for_key(ctx.id.shard_key).clone();
    // One handler invocation: a step's closure that ran twice shows as
    // effects of two runs.
    let run: i64 = rand::random::<i64>().abs();
    effect_step(&ctx, &shard, "effect:before", run, serde_json::json!(n)).await?;
    ctx.sleep(Duration::from_millis(SLEEP_MIN_MS + n % SLEEP_SPREAD_MS))
        .await?;
    let passed = shard.clone();
    let id = ctx.id;
    let _woke: serde_json::Value = ctx
        .step("woke", || async move { woke(&passed, id).await })
        .await?;
    for topic in TOPICS {
        for _ in 0..topic.messages {
            ctx.recv(topic.name, topic.timeout).await?;
        }
    }
    let mut handles = Vec::new();
    let count = children(n);
    for i in 0..count {
        let payload = serde_json::json!({ "parent": n, "i": i, "to": ctx.id.to_string() });
        let child = NewJob::new(CHILD_QUEUE, CHILD_HANDLER, payload).ordering_key(child_key(n, i));
        handles.push(ctx.start_child(child).await?);
    }
    let mut gathered = Vec::new();
    for handle in &handles {
        match handle.result().await? {
            ChildResult::Succeeded(output) => gathered.push(output["v"].clone()),
            other => return Err(format!("child {} ended {other:?}", handle.id()).into()),
        }
    }
    effect_step(&ctx, &shard, "gathered", run, serde_json::json!(gathered)).await?;
    for _ in 0..count {
        if ctx.recv(KIDS_TOPIC, KIDS_TIMEOUT).await?.is_none() {
            return Err("a child's message did not come".into());
        }
    }
    Ok(serde_json::json!({ "n": n }))
}

/// A step whose closure inserts a side effect `(job, step, run, value)`
/// and returns `{run, value}`, which its record keeps.
async fn effect_step(
    ctx: &JobContext,
    shard: &Shard,
    step: &'static str,
    run: i64,
    value: serde_json::Value,
) -> Result<(), HandlerError> {
    let (id, attempt) = (ctx.id, ctx.attempt);
    let _recorded: serde_json::Value = ctx
        .step(step, || async move {
            let db = shard.client().await?;
            db.execute(
                sql::EFFECT_INSERT,
                &[&id.shard_key, &id.id, &step, &attempt, &run, &value],
            )
            .await
            .map_err(|e| shard.query_error(e))?;
            Ok::<_, HandlerError>(serde_json::json!({ "run": run, "value": value }))
        })
        .await?;
    Ok(())
}

/// The run that passed the sleep, as the shard sees it: when its claim was
/// made, the time now, and whether the job had failed before (a retry's
/// claim may come before the wake time; its replay then parks again).
async fn woke(shard: &Shard, id: JobId) -> Result<serde_json::Value, HandlerError> {
    let db = shard.client().await?;
    let row = db
        .query_one(sql::RUN_CLAIM, &[&id.shard_key, &id.id])
        .await
        .map_err(|e| shard.query_error(e))?;
    Ok(row.get(0))
}

/// The step in which a child records its side effect.
pub const CHILD_STEP: &str = "child";

/// A child: records a side effect in a step ([`CHILD_STEP`]), sends its
/// parent its value on [`KIDS_TOPIC`] (exactly once, whatever retries or
/// parks), and returns its value and attempt.
pub async fn child(shards: ShardSet, ctx: JobContext) -> HandlerResult {
    let (Some(parent), Some(i), Some(to)) = (
        ctx.payload["parent"].as_u64(),
        ctx.payload["i"].as_u64(),
        ctx.payload["to"]
            .as_str()
            .and_then(|s| s.parse::<JobId>().ok()),
    ) else {
        return Err("a child's payload names its parent's number, id and its index".into());
    };
    let shard = shards.for_key(ctx.id.shard_key).clone();
    let v = child_value(parent, i);
    let run: i64 = rand::random::<i64>().abs();
    effect_step(&ctx, &shard, CHILD_STEP, run, serde_json::json!(v)).await?;
    ctx.send(to, KIDS_TOPIC, serde_json::json!({ "k": i, "v": v }))
        .await?;
    Ok(serde_json::json!({ "v": v, "attempt": ctx.attempt }))
}
