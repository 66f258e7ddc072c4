//! Online resharding (`shardq::reshard`): the shard list grows 2 → 4 and
//! shrinks 4 → 3 while workers run and a producer enqueues. Keyed jobs (some
//! failing once and retried after a backoff that spans the move), delayed
//! jobs, deduplicated jobs enqueued again during the move, workflows whose
//! first attempt recorded a step and failed: every job succeeds exactly
//! once, per key in enqueue order, no deduplication id is admitted twice, no
//! step runs twice, and every unfinished job ends on the shard its range
//! maps to.

use crate::common;

use super::{unfinished, WORKER_TOML};
use common::{micros, wait_until, ShardList, TestShards};
use serde_json::json;
use shardq::reshard::{reshard, Options, Step};
use shardq::shards::ShardSet;
use shardq::{
    Client, ClientError, Config, HandlerRegistry, JobId, JobStatus, NewJob, OnDuplicate, Worker,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const KEYS: usize = 120;
const FIRST_REVISIONS: i64 = 4;
const WORKFLOWS: usize = 60;
const DEDUPLICATED: usize = 40;

/// Every handler call, on a database of its own (shard 0's server).
const CALLS_TABLE: &str = "CREATE TABLE IF NOT EXISTS test_calls (job bigint, shard_key int, \
    key text, revision bigint, what text, started_us bigint, finished_us bigint)";

/// `record` (keyed revisions; `fail_once` fails its first attempt) and
/// `workflow` (records step `a`, fails its first attempt, then records
/// step `b`); each call writes a row to `calls`.
fn registry(calls: ShardSet) -> HandlerRegistry {
    let mut registry = HandlerRegistry::with_builtins();
    let recorder = calls.clone();
    registry.register("record", move |ctx| {
        let calls = recorder.clone();
        async move {
            let started = micros();
            tokio::time::sleep(Duration::from_millis(2)).await;
            let failing = ctx.payload["fail_once"].as_bool() == Some(true) && ctx.attempt == 1;
            let what = if failing { "failed" } else { "ok" };
            record(&calls, &ctx, what, started).await?;
            if failing {
                return Err("fails its first attempt".into());
            }
            Ok(serde_json::Value::Null)
        }
    });
    registry.register("workflow", move |ctx| {
        let calls = calls.clone();
        async move {
            let started = micros();
            let step_calls = calls.clone();
            let step_ctx = ctx.clone();
            ctx.step("a", || async move {
                record(&step_calls, &step_ctx, "step-a", started).await?;
                Ok::<_, shardq::worker::HandlerError>(json!(1))
            })
            .await?;
            if ctx.attempt == 1 {
                return Err("fails after step a".into());
            }
            record(&calls, &ctx, "ok", started).await?;
            Ok(serde_json::Value::Null)
        }
    });
    registry
}

async fn record(
    calls: &ShardSet,
    ctx: &shardq::worker::JobContext,
    what: &str,
    started: i64,
) -> Result<(), shardq::worker::HandlerError> {
    let revision = ctx.payload["revision"].as_i64().unwrap_or(-1);
    calls
        .get(0)
        .client()
        .await?
        .execute(
            "INSERT INTO test_calls VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &ctx.id.id,
                &ctx.id.shard_key,
                &ctx.ordering_key,
                &revision,
                &what,
                &started,
                &micros(),
            ],
        )
        .await?;
    Ok(())
}

fn keyed(key: usize, revision: i64) -> NewJob {
    NewJob::new(
        "moving",
        "record",
        json!({ "revision": revision, "fail_once": (key + revision as usize) % 7 == 0 }),
    )
    .ordering_key(format!("key-{key}"))
}

/// The `i`-th deduplication id: one per 1/DEDUPLICATED of the shard keys,
/// so every moving range has some (ids that differ only in their last
/// characters hash close together).
fn dedup_id(i: usize) -> String {
    let width = 65_536 / DEDUPLICATED as i32;
    (0..)
        .map(|n| format!("dedup-{n}"))
        .find(|id| shardq::router::shard_key_for(id) / width == i as i32)
        .unwrap()
}

fn deduplicated(i: usize) -> NewJob {
    NewJob::new("moving", "record", json!({}))
        .dedup(dedup_id(i), OnDuplicate::Error)
        .delay(Duration::from_secs(10))
}

/// The jobs before the move: revisions of every key, workflows, delayed
/// unkeyed jobs and deduplicated ones (delayed past the move).
fn first_jobs() -> Vec<NewJob> {
    let mut jobs: Vec<NewJob> = (0..KEYS)
        .flat_map(|k| (0..FIRST_REVISIONS).map(move |r| keyed(k, r)))
        .collect();
    jobs.extend((0..WORKFLOWS).map(|i| NewJob::new("moving", "workflow", json!({ "w": i }))));
    jobs.extend((0..40).map(|i| {
        NewJob::new("moving", "record", json!({ "d": i }))
            .delay(Duration::from_millis(300 + 50 * i))
    }));
    jobs.extend((0..DEDUPLICATED).map(deduplicated));
    jobs
}

fn worker(
    config: &Config,
    calls: &ShardSet,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let config = config.clone();
    let calls = calls.clone();
    let stop = stop.clone();
    tokio::spawn(async move {
        let shards = ShardSet::connect(&config).unwrap();
        Worker::new(config, shards, registry(calls)).run(stop).await;
    })
}

/// Revisions of every key, in rounds, and the deduplicated jobs again,
/// until `done`; returns the next revision and how many duplicates were
/// refused. A deduplicated job enqueued again while the first (`originals`,
/// by index) is unfinished must be refused.
fn producer(
    client: Client,
    originals: Vec<JobId>,
    done: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(i64, usize)> {
    tokio::spawn(async move {
        let mut revision = FIRST_REVISIONS;
        let mut refused = 0;
        while !done.load(Ordering::Relaxed) || revision < FIRST_REVISIONS + 3 {
            let jobs: Vec<NewJob> = (0..KEYS).map(|k| keyed(k, revision)).collect();
            client
                .enqueue_many(jobs)
                .await
                .expect("a round of revisions");
            revision += 1;
            let i = revision as usize % DEDUPLICATED;
            let first = client.job(originals[i]).await.unwrap().expect("the first");
            if first.status != JobStatus::Scheduled {
                continue; // ran already: a new one may be admitted
            }
            match client.enqueue(deduplicated(i)).await {
                Err(ClientError::Duplicate { .. }) => refused += 1,
                other => panic!("{} admitted again during the move: {other:?}", dedup_id(i)),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (revision, refused)
    })
}

/// Moves `from` shards to `to` with workers and a producer running, then
/// checks every promise.
async fn move_under_load(from: usize, to: usize) {
    let servers = TestShards::databases(from.max(to) + 1).await;
    let urls = &servers.urls[..from.max(to)];
    let calls_url = servers.urls[from.max(to)].clone();
    let old = Config::from_toml(
        &ShardList::numbered(&urls[..from])
            .pool_size(12)
            .toml(WORKER_TOML),
    )
    .unwrap();
    let new = Config::from_toml(
        &ShardList::numbered(&urls[..to])
            .pool_size(12)
            .toml(WORKER_TOML),
    )
    .unwrap();
    let longer = if to > from { new.clone() } else { old.clone() };
    let calls = ShardSet::connect(
        &Config::from_toml(&ShardList::numbered(&[calls_url]).pool_size(12).toml("")).unwrap(),
    )
    .unwrap();
    calls
        .get(0)
        .client()
        .await
        .unwrap()
        .batch_execute(CALLS_TABLE)
        .await
        .unwrap();
    let old_set = ShardSet::connect(&old).unwrap();
    shardq::migrate::migrate_all(&old_set)
        .await
        .expect("migrate");
    let all = ShardSet::connect(&longer).unwrap();
    for shard in &all.all()[from..] {
        shardq::migrate::migrate_joining(shard, to)
            .await
            .expect("migrate a new shard");
    }

    // The producer's client lists every shard (the longer list): it routes
    // by whatever map the shards record.
    let client = Client::new(&longer).unwrap();
    let first = client.enqueue_many(first_jobs()).await.expect("first jobs");
    assert_eq!(first.len(), first_jobs().len());
    let originals = first[first.len() - DEDUPLICATED..].to_vec();

    let stop = CancellationToken::new();
    let old_worker = worker(&old, &calls, &stop);
    // Let some first attempts fail (their retries wait out the move).
    tokio::time::sleep(Duration::from_millis(700)).await;
    let done = Arc::new(AtomicBool::new(false));
    let producing = producer(client.clone(), originals, done.clone());

    // Stopped after it opened the ranges, then run again: it goes on from
    // there.
    let stopped = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    let opened = reshard(&all, from, to, &stopped, |_| {})
        .await
        .expect("first step");
    assert!(!opened.complete && opened.ranges > 0);
    // The new list starts now (its place is recorded on every shard).
    let new_worker = worker(&new, &calls, &stop);
    let summary = reshard(&all, from, to, &Options::default(), |_| {})
        .await
        .expect("the move finishes");
    assert!(summary.complete, "{summary:?}");

    assert!(
        opened.moved + summary.moved > 0,
        "unclaimed jobs were copied: {opened:?} {summary:?}"
    );
    done.store(true, Ordering::Relaxed);
    let (revisions, refused) = producing.await.unwrap();
    assert!(refused > 0, "the producer met its duplicates");
    let last: Vec<NewJob> = (0..KEYS).map(|k| keyed(k, revisions)).collect();
    client
        .enqueue_many(last)
        .await
        .expect("revisions after the move");
    let revisions = revisions + 1;

    wait_until(Duration::from_secs(120), "every job finished", || async {
        unfinished(&all).await == 0
    })
    .await;
    stop.cancel();
    old_worker.await.unwrap();
    new_worker.await.unwrap();

    check_outcome(&all, &calls, to, revisions).await;
}

async fn check_outcome(all: &ShardSet, calls: &ShardSet, to: usize, revisions: i64) {
    // Every job exactly once in the tables, succeeded, none held.
    let mut rows: HashMap<(i32, i64), (usize, String)> = HashMap::new();
    let mut dedup_rows: HashMap<String, usize> = HashMap::new();
    let mut kinds: HashMap<String, usize> = HashMap::new();
    let mut revisions_seen: std::collections::HashSet<(String, i64)> = Default::default();
    let map = all.load_map().await.expect("map");
    assert_eq!(map.shard_count(), to);
    for shard in all.all() {
        let db = shard.client().await.unwrap();
        for r in db
            .query(
                "SELECT shard_key, id, status, dedup_id, ordering_key, \
                 (payload->>'revision')::bigint, handler FROM workflow_status",
                &[],
            )
            .await
            .unwrap()
        {
            let at = (r.get::<_, i32>(0), r.get::<_, i64>(1));
            let status: String = r.get(2);
            assert_eq!(status, "succeeded", "job {at:?} on {}", shard.name);
            assert!(
                rows.insert(at, (shard.index, status)).is_none(),
                "job {at:?} twice"
            );
            if let Some(d) = r.get::<_, Option<String>>(3) {
                *dedup_rows.entry(d).or_default() += 1;
            }
            *kinds.entry(r.get::<_, String>(6)).or_default() += 1;
            if let (Some(key), Some(rev)) = (r.get(4), r.get(5)) {
                revisions_seen.insert((key, rev));
            }
        }
        let triggers: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_trigger WHERE tgname = 'shardq_hold_moving'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(triggers, 0, "the hold trigger is gone from {}", shard.name);
    }
    let expected = KEYS as i64 * revisions + (WORKFLOWS + 40 + DEDUPLICATED) as i64;
    let missing: Vec<(String, i64)> = (0..KEYS)
        .flat_map(|k| (0..revisions).map(move |r| (format!("key-{k}"), r)))
        .filter(|at| !revisions_seen.contains(at))
        .collect();
    assert_eq!(
        rows.len() as i64,
        expected,
        "every job enqueued is there once; by handler {kinds:?}, \
         {} deduplicated, keyed revisions missing: {missing:?}",
        dedup_rows.len()
    );
    assert_eq!(dedup_rows.len(), DEDUPLICATED);
    assert!(
        dedup_rows.values().all(|&n| n == 1),
        "a dedup id admitted twice: {dedup_rows:?}"
    );

    // Calls: one success per job, step a once per workflow, keys in order.
    let db = calls.get(0).client().await.unwrap();
    let mut ok: HashMap<(i32, i64), usize> = HashMap::new();
    let mut step_a: HashMap<(i32, i64), usize> = HashMap::new();
    let mut by_key: HashMap<String, Vec<(i64, i64, i64)>> = HashMap::new();
    for r in db
        .query(
            "SELECT job, shard_key, key, revision, what, started_us, finished_us FROM test_calls",
            &[],
        )
        .await
        .unwrap()
    {
        let at = (r.get::<_, i32>(1), r.get::<_, i64>(0));
        let what: String = r.get(4);
        match what.as_str() {
            "ok" => *ok.entry(at).or_default() += 1,
            "step-a" => *step_a.entry(at).or_default() += 1,
            _ => {}
        }
        if let Some(key) = r.get::<_, Option<String>>(2) {
            by_key
                .entry(key)
                .or_default()
                .push((r.get(3), r.get(5), r.get(6)));
        }
    }
    assert_eq!(ok.len(), rows.len(), "every job succeeded in a call");
    assert!(ok.values().all(|&n| n == 1), "a job succeeded twice");
    assert_eq!(step_a.len(), WORKFLOWS);
    assert!(
        step_a.values().all(|&n| n == 1),
        "a recorded step ran again"
    );
    for (key, mut calls) in by_key {
        calls.sort_by_key(|c| c.1);
        let order: Vec<i64> = calls.iter().map(|c| c.0).collect();
        let mut sorted = order.clone();
        sorted.sort();
        if order != sorted {
            let mut detail = Vec::new();
            for shard in all.all() {
                let db = shard.client().await.unwrap();
                for r in db
                    .query(
                        "SELECT id, status, payload->>'revision', created_at::text, started_at::text, finished_at::text \
                         FROM workflow_status WHERE ordering_key = $1 ORDER BY id",
                        &[&key],
                    )
                    .await
                    .unwrap()
                {
                    detail.push(format!(
                        "{} id={} {} rev={:?} created={:?} started={:?} finished={:?}",
                        shard.name,
                        r.get::<_, i64>(0),
                        r.get::<_, String>(1),
                        r.get::<_, Option<String>>(2),
                        r.get::<_, Option<String>>(3),
                        r.get::<_, Option<String>>(4),
                        r.get::<_, Option<String>>(5)
                    ));
                }
            }
            panic!(
                "key {key} ran out of order: {order:?}\n{}",
                detail.join("\n")
            );
        }
        for pair in calls.windows(2) {
            assert!(pair[1].1 >= pair[0].2, "key {key}: calls overlap: {pair:?}");
        }
    }
    // The revisions enqueued after the move are on the shard the new map
    // gives their key.
    let mut after = 0;
    for shard in all.all() {
        let db = shard.client().await.unwrap();
        for r in db
            .query(
                "SELECT shard_key FROM workflow_status WHERE (payload->>'revision')::bigint = $1",
                &[&(revisions - 1)],
            )
            .await
            .unwrap()
        {
            after += 1;
            let shard_key: i32 = r.get(0);
            assert_eq!(map.shard_for(shard_key), shard.index, "key {shard_key}");
        }
    }
    assert_eq!(after, KEYS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_two_shards_to_four_under_load() {
    move_under_load(2, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrinking_four_shards_to_three_under_load() {
    move_under_load(4, 3).await;
}
