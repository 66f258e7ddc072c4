//! Online resharding (`shardq::reshard`): the shard list grows 2 → 4 and
//! shrinks 4 → 3 while workers run and a producer enqueues. Keyed jobs (some
//! failing once and retried after a backoff that spans the move), delayed
//! jobs, deduplicated jobs enqueued again during the move, workflows whose
//! first attempt recorded a step and failed: every job succeeds exactly
//! once, per key in enqueue order, no deduplication id is admitted twice, no
//! step runs twice, and every unfinished job ends on the shard its range
//! maps to.

use crate::common;

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

const WORKER_TOML: &str = "
[dequeue]
batch_size = 50
empty_backoff_min_ms = 5
empty_backoff_max_ms = 50
[worker]
queues = [\"moving\"]
concurrency = 8
maintenance_interval_ms = 100
retry_backoff_min_ms = 1500
retry_backoff_max_ms = 1500
";

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

async fn unfinished(shards: &ShardSet) -> i64 {
    let mut n = 0;
    for shard in shards.all() {
        let row = shard
            .client()
            .await
            .unwrap()
            .query_one(
                "SELECT count(*) FROM workflow_status \
                 WHERE status NOT IN ('succeeded', 'dead', 'cancelled', 'failed')",
                &[],
            )
            .await
            .unwrap();
        n += row.get::<_, i64>(0);
    }
    n
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

/// A key whose shard key the move 2 → 3 gives to the new shard.
/// Shards 0 and 1 migrated with a two-shard map, shard 2 migrated to join
/// (`TestShards` of three), with the configs of both lists (`extra` added)
/// and the plan of 2 → 3. Bind `servers`: dropping it stops them.
pub(crate) struct GrowingToThree {
    pub servers: TestShards,
    pub old: Config,
    pub new: Config,
    pub all: ShardSet,
    pub plan: shardq::reshard::Plan,
}

pub(crate) async fn growing_to_three(servers: TestShards, extra: &str) -> GrowingToThree {
    let old = Config::from_toml(
        &ShardList::numbered(&servers.urls[..2])
            .pool_size(12)
            .toml(extra),
    )
    .unwrap();
    let new =
        Config::from_toml(&ShardList::numbered(&servers.urls).pool_size(12).toml(extra)).unwrap();
    shardq::migrate::migrate_all(&ShardSet::connect(&old).unwrap())
        .await
        .unwrap();
    let all = ShardSet::connect(&new).unwrap();
    shardq::migrate::migrate_joining(all.get(2), 3)
        .await
        .unwrap();
    let plan = shardq::reshard::plan(shardq::shard_map::ShardMap::from_formula(2).ranges(), 3);
    GrowingToThree {
        servers,
        old,
        new,
        all,
        plan,
    }
}

/// [`growing_to_three`] on three servers (one can be frozen), statements
/// given up after `statement_ms`, with `jobs` enqueued by the map of two.
async fn on_servers_with_jobs(
    statement_ms: u64,
    jobs: Vec<NewJob>,
) -> (GrowingToThree, Vec<JobId>) {
    let fast = format!("{WORKER_TOML}[database]\nstatement_timeout_ms = {statement_ms}\n");
    let m = growing_to_three(TestShards::servers(3).await, &fast).await;
    let first = Client::new(&m.new)
        .unwrap()
        .enqueue_many(jobs)
        .await
        .unwrap();
    (m, first)
}

/// A REPEATABLE READ transaction on `db`, its snapshot not yet taken.
async fn repeatable_read(db: &mut deadpool_postgres::Client) -> deadpool_postgres::Transaction<'_> {
    db.build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await
        .unwrap()
}

fn moving_key(plan: &shardq::reshard::Plan, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| {
            let at = shardq::router::shard_key_for(k);
            plan.moves
                .iter()
                .any(|m| m.first_key <= at && at < m.end_key && m.to_index == 2)
        })
        .unwrap()
}

async fn statuses(shard: &shardq::shards::Shard) -> HashMap<String, i64> {
    let db = shard.client().await.unwrap();
    db.query(
        "SELECT status, count(*) FROM workflow_status GROUP BY status",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// The command stopped after each step and run again: while a range is
/// recorded but not yet open (the command died in between), an enqueue of
/// it waits (SQ005, tried again) and writes nothing; once open, it is
/// written held, and a client with the
/// old map is fenced, reloads and writes the job held on the new shard; the
/// copy leaves the old shard no unclaimed job of the range; the last run
/// releases everything, and a worker runs every job once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_stopped_at_each_step_finishes_when_run_again() {
    let GrowingToThree {
        servers: _servers,
        new,
        all,
        plan,
        ..
    } = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let key = moving_key(&plan, "mover");
    let dedup = moving_key(&plan, "order");
    let once = || {
        NewJob::new("moving", "noop", json!({}))
            .dedup(dedup.clone(), OnDuplicate::Error)
            .delay(Duration::from_millis(500))
    };
    // Loaded at epoch 1, before the move: stale from here on.
    let stale = Client::new(&new).unwrap();
    let mut jobs: Vec<NewJob> = (0..300)
        .map(|i| NewJob::new("moving", "noop", json!({ "i": i })))
        .collect();
    let in_order =
        |r: i64| NewJob::new("moving", "noop", json!({ "revision": r })).ordering_key(key.clone());
    jobs.extend((0..5).map(in_order));
    jobs.push(once());
    let first = stale.enqueue_many(jobs).await.unwrap();

    let step = |s| Options {
        stop_after: Some(s),
        ..Options::default()
    };
    reshard(&all, 2, 3, &step(Step::Recorded), |_| {})
        .await
        .unwrap();
    // An enqueue into the range waits for the move to open it (a running
    // move does within seconds of recording), writing nothing until then.
    let waiting = Client::new(&new).unwrap();
    let waited = tokio::spawn({
        let job =
            NewJob::new("moving", "noop", json!({ "waited": true })).ordering_key(key.clone());
        async move { waiting.enqueue(job).await }
    });
    // Longer than the client's retries of other errors (5 tries, about
    // 2 s of pauses).
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!waited.is_finished(), "it waits while the range is closed");
    let total: i64 = futures_util::future::join_all(all.all().iter().map(statuses))
        .await
        .iter()
        .flat_map(|m| m.values())
        .sum();
    assert_eq!(
        total,
        first.len() as i64,
        "the waiting enqueue wrote nothing yet"
    );

    reshard(&all, 2, 3, &step(Step::Opened), |_| {})
        .await
        .unwrap();
    let waited = waited
        .await
        .unwrap()
        .expect("written once its range opened");
    assert_eq!(
        stale.job(waited).await.unwrap().unwrap().status,
        JobStatus::Held
    );
    let held = stale
        .enqueue(in_order(5))
        .await
        .expect("fenced, reloaded, written on the new shard");
    assert_eq!(stale.shards().routing().get().epoch(), 2);
    let info = stale.job(held).await.unwrap().unwrap();
    assert_eq!(info.status, JobStatus::Held);
    // Its range is open, its jobs not yet copied: the deduplication ids
    // were, before the range opened.
    match stale.enqueue(once()).await {
        Err(ClientError::Duplicate { .. }) => {}
        other => panic!("{dedup} admitted twice while its range moves: {other:?}"),
    }

    reshard(&all, 2, 3, &step(Step::Copied), |_| {})
        .await
        .unwrap();
    let on_new = statuses(all.get(2)).await;
    assert!(
        on_new.get("held").copied().unwrap_or(0) > 6,
        "copied jobs wait held: {on_new:?}"
    );
    assert_eq!(
        on_new.len(),
        1,
        "nothing but held jobs on the new shard: {on_new:?}"
    );
    for m in &plan.moves {
        let left = shardq::store::reshard::left(all.get(m.from_index), (m.first_key, m.end_key))
            .await
            .unwrap();
        assert_eq!(left, 0, "the old shard keeps no unclaimed job of {m:?}");
    }

    let summary = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    let again = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(again.ranges, 0, "a finished move has nothing left to do");

    let report = Worker::new(new.clone(), all.clone(), HandlerRegistry::with_builtins())
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    assert_eq!(report.stats.succeeded as usize, first.len() + 2);
    assert_eq!(
        futures_util::future::join_all(all.all().iter().map(statuses))
            .await
            .iter()
            .flat_map(|m| m.iter())
            .filter(|(status, _)| status.as_str() != "succeeded")
            .count(),
        0,
        "every job succeeded"
    );
}

/// A schedule whose key is on the shard that leaves (3 → 2): its worker,
/// running through the move, is refused on the old shard, finds the new one
/// and goes on from the last tick copied there. Every tick is enqueued once,
/// and those after the move on the schedule's new shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_follows_its_key_to_its_new_shard() {
    let servers = TestShards::databases(3).await;
    let name = (0..)
        .map(|i| format!("tick-{i}"))
        .find(|n| shardq::router::shard_key_for(n) >= 43_691)
        .unwrap();
    let toml = format!(
        "[worker]\nqueues = [\"ticks\"]\nconcurrency = 2\nmaintenance_interval_ms = 100\n\n\
         [[schedules]]\nname = \"{name}\"\ncron = \"* * * * * *\"\nqueue = \"ticks\"\n\
         handler = \"noop\"\n"
    );
    let config =
        Config::from_toml(&ShardList::numbered(&servers.urls).pool_size(12).toml(&toml)).unwrap();
    let all = ShardSet::connect(&config).unwrap();
    shardq::migrate::migrate_all(&all).await.unwrap();
    let stop = CancellationToken::new();
    let running = {
        let (config, shards, stop) = (config.clone(), all.clone(), stop.clone());
        tokio::spawn(async move {
            Worker::new(config, shards, HandlerRegistry::with_builtins())
                .run(stop)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let summary = reshard(&all, 3, 2, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    let moved_at = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    stop.cancel();
    running.await.unwrap();

    let owner = all
        .load_map()
        .await
        .unwrap()
        .shard_for(shardq::router::shard_key_for(&name));
    assert_ne!(owner, 2);
    let mut ticks: HashMap<String, usize> = HashMap::new();
    let mut after = 0;
    for shard in all.all() {
        let db = shard.client().await.unwrap();
        for r in db
            .query(
                "SELECT dedup_id, created_at FROM workflow_status WHERE queue = 'ticks'",
                &[],
            )
            .await
            .unwrap()
        {
            *ticks.entry(r.get(0)).or_default() += 1;
            if r.get::<_, chrono::DateTime<chrono::Utc>>(1) > moved_at {
                after += 1;
                assert_eq!(shard.index, owner, "a tick after the move on its old shard");
            }
        }
    }
    assert!(
        ticks.values().all(|&n| n == 1),
        "a tick enqueued twice: {ticks:?}"
    );
    assert!(
        after >= 2,
        "the schedule ticked on after the move ({after})"
    );
    assert!(ticks.len() >= 4, "{ticks:?}");
}

/// The old shard frozen (SIGSTOP) while its range is being copied: the
/// command's statements there give up at their deadline and are tried
/// again; once the server answers again the move finishes, and every job
/// runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_frozen_during_the_copy_makes_the_move_wait_and_lose_nothing() {
    use nix::sys::signal::Signal;
    let jobs: Vec<NewJob> = (0..3_000)
        .map(|i| {
            NewJob::new("moving", "noop", json!({ "i": i })).ordering_key(format!("k-{}", i % 300))
        })
        .collect();
    let (
        GrowingToThree {
            servers, new, all, ..
        },
        first,
    ) = on_servers_with_jobs(1_000, jobs).await;
    // Frozen once the ranges are open, as the copy begins; thawed 3 s later.
    let frozen = std::sync::atomic::AtomicBool::new(false);
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut retries = 0;
    let moving = async {
        let summary = reshard(&all, 2, 3, &Options::default(), |p| match p {
            shardq::reshard::Progress::Done(Step::Opened) => {
                servers.servers[0]
                    .server()
                    .signal_all(Signal::SIGSTOP)
                    .unwrap();
                frozen.store(true, Ordering::SeqCst);
            }
            shardq::reshard::Progress::Retrying { .. } => retries += 1,
            _ => {}
        })
        .await;
        done.store(true, Ordering::SeqCst);
        summary
    };
    let thaw = async {
        while !frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let waited = !done.load(Ordering::SeqCst);
        servers.servers[0]
            .server()
            .signal_all(Signal::SIGCONT)
            .unwrap();
        waited
    };
    let (summary, waited) = tokio::time::timeout(Duration::from_secs(90), async {
        tokio::join!(moving, thaw)
    })
    .await
    .expect("the move finishes once the shard answers");
    let summary = summary.unwrap();
    assert!(waited, "the move waited for the frozen shard");
    assert!(retries > 0, "the frozen shard's steps were retried");
    assert!(summary.complete && summary.moved > 0, "{summary:?}");

    let report = Worker::new(new.clone(), all.clone(), HandlerRegistry::with_builtins())
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    assert_eq!(report.stats.succeeded as usize, first.len());
    assert_eq!(unfinished(&all).await, 0);
}

/// `shardq reshard` as a user runs it: the dry run prints the plan and
/// changes nothing, the move prints its end, `shards show` the new epoch;
/// a new list that reorders the current shards is refused, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_plans_moves_and_refuses_a_reordered_list() {
    let servers = TestShards::databases(3).await;
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, urls: &[String]| {
        let path = dir.path().join(name);
        std::fs::write(&path, ShardList::numbered(urls).pool_size(12).toml("")).unwrap();
        path
    };
    let old = write("old.toml", &servers.urls[..2]);
    let new = write("new.toml", &servers.urls);
    let reordered = write(
        "reordered.toml",
        &[
            servers.urls[1].clone(),
            servers.urls[0].clone(),
            servers.urls[2].clone(),
        ],
    );
    let run = shardq_harness::exe::shardq_output;
    assert!(run(&old, &["migrate"]).await.0);

    let (ok, text) = run(
        &old,
        &["reshard", "--to", new.to_str().unwrap(), "--dry-run"],
    )
    .await;
    assert!(ok, "{text}");
    assert!(text.contains("plan for epoch 2: 2 ranges move"), "{text}");
    assert!(
        text.contains("s0 → s2") && text.contains("s1 → s2"),
        "{text}"
    );
    assert!(text.contains("dry run: nothing changed"), "{text}");
    let (ok, text) = run(&new, &["shards", "show"]).await;
    assert!(
        ok && text.contains("shard map epoch 1 (2 shards)"),
        "{text}"
    );

    let (ok, text) = run(&old, &["reshard", "--to", reordered.to_str().unwrap()]).await;
    assert!(!ok, "{text}");
    assert!(
        text.contains("the new list replaces shard 0 and has 3 shards instead of 2"),
        "{text}"
    );

    let (ok, text) = run(&old, &["reshard", "--to", new.to_str().unwrap()]).await;
    assert!(ok, "{text}");
    assert!(text.contains("done: epoch 2, 2 ranges moved"), "{text}");
    let (ok, text) = run(&new, &["shards", "show"]).await;
    assert!(
        ok && text.contains("shard map epoch 2 (3 shards)"),
        "{text}"
    );
    let (ok, text) = run(&new, &["check"]).await;
    assert!(ok, "the moved fleet passes `shardq check`: {text}");
}

/// A job copied to its new shard whose old row was not yet removed (the
/// command stopped between the two), then cancelled (the cancel finds the
/// copy, on the shard its key routes to): the next run copies the job again
/// and must keep the cancel; the job never runs. Before, the new copy
/// replaced the cancelled one and the job ran after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_a_copy_survives_the_copy_being_made_again() {
    let GrowingToThree {
        servers: _servers,
        new,
        all,
        plan,
        ..
    } = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let key = moving_key(&plan, "victim");
    let client = Client::new(&new).unwrap();
    let victim = client
        .enqueue(NewJob::new("moving", "noop", json!({})).ordering_key(key))
        .await
        .unwrap();
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&all, 2, 3, &opened, |_| {}).await.unwrap();

    // The copy, as the drain makes it, stopped before the removal.
    let m = plan
        .moves
        .iter()
        .find(|m| m.first_key <= victim.shard_key && victim.shard_key < m.end_key)
        .unwrap();
    let (from, to) = (all.get(m.from_index), all.get(2));
    let chunk = (victim.shard_key, victim.shard_key + 1);
    use shardq::store::reshard as store;
    store::mark_held(from, chunk).await.unwrap();
    let (jobs, steps) = store::read_held(from, chunk, 0, 10_000).await.unwrap();
    store::write_copies(to, &jobs, &steps, &json!([]))
        .await
        .unwrap();
    // The cancel as a client with the new map makes it: on the copy, on
    // the shard the key routes to now; the old row is not asked.
    assert_eq!(
        shardq::store::jobs::cancel(to, victim).await.unwrap(),
        Some(JobStatus::Held)
    );

    let summary = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    Worker::new(new.clone(), all.clone(), HandlerRegistry::with_builtins())
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    let info = client.job(victim).await.unwrap().expect("the job");
    assert_eq!(info.status, JobStatus::Cancelled, "the cancel was kept");
}

/// Reads and changes of one job while its range moves, from a client
/// routing by the new map: a deduplicated job running on its old shard has
/// a stand-in on the new one (its deduplication id), which is not the job:
/// `job()` shows the running job, `cancel()` reaches it there, `result()`
/// waits for it; a queued job that `result()` waits on is copied to the new
/// shard and removed from the old one meanwhile, and the wait follows it.
/// Before, the stand-in answered the first three (held; no cancel; "not
/// found" at the release) and the moved job was "not found".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_during_a_move_find_the_job_where_it_is() {
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let client = Client::new(&m.new).unwrap();
    let running = |name: &str| {
        let key = moving_key(&m.plan, name);
        NewJob::new("moving", "sleep", json!({ "ms": 3_000 })).dedup(key, OnDuplicate::Error)
    };
    let awaited = client.enqueue(running("awaited")).await.unwrap();
    let cancelled = client.enqueue(running("cancelled")).await.unwrap();
    let queued = client
        .enqueue(
            NewJob::new("later", "noop", json!({})).ordering_key(moving_key(&m.plan, "queued")),
        )
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let old_worker = {
        let (config, stop) = (m.old.clone(), stop.clone());
        tokio::spawn(async move {
            let shards = ShardSet::connect(&config).unwrap();
            Worker::new(config, shards, HandlerRegistry::with_builtins())
                .run(stop)
                .await
        })
    };
    wait_until(
        Duration::from_secs(20),
        "both jobs run on their old shard",
        || async {
            let a = client.job(awaited).await.unwrap().unwrap().status;
            let c = client.job(cancelled).await.unwrap().unwrap().status;
            a == JobStatus::Running && c == JobStatus::Running
        },
    )
    .await;
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &opened, |_| {}).await.unwrap();
    assert_eq!(client.shards().load_map().await.unwrap().epoch(), 2);
    let stand_ins = statuses(m.all.get(2)).await;
    assert_eq!(stand_ins.get("held"), Some(&2), "{stand_ins:?}");

    let info = client.job(awaited).await.unwrap().expect("the job");
    assert_eq!(info.status, JobStatus::Running, "the job, not its stand-in");
    assert_eq!(
        client.cancel(cancelled).await.unwrap(),
        Some(JobStatus::Running),
        "the cancel reaches the running job"
    );
    let asked: bool = m
        .all
        .get(usize::from(cancelled.shard_key >= 32_768))
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT cancel_requested FROM workflow_status WHERE id = $1",
            &[&cancelled.id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        asked,
        "the running row on the old shard was asked to cancel"
    );
    // Both waits find their job on its old shard before the drain begins.
    let waits = {
        let client = client.clone();
        tokio::spawn(async move {
            let timeout = Duration::from_secs(60);
            tokio::join!(
                client.result(awaited, timeout),
                client.result(queued, timeout)
            )
        })
    };

    tokio::time::sleep(Duration::from_millis(300)).await;
    let summary = reshard(&m.all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete && summary.moved >= 1, "{summary:?}");
    stop.cancel();
    old_worker.await.unwrap();
    let later = Config::from_toml(
        &ShardList::numbered(&m.servers.urls)
            .pool_size(12)
            .toml("[worker]\nqueues = [\"later\"]\n"),
    )
    .unwrap();
    Worker::new(later, m.all.clone(), HandlerRegistry::with_builtins())
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    let (awaited_outcome, queued_outcome) = waits.await.unwrap();
    assert!(
        matches!(awaited_outcome, Ok(shardq::JobOutcome::Succeeded(_))),
        "{awaited_outcome:?}"
    );
    assert!(
        matches!(queued_outcome, Ok(shardq::JobOutcome::Succeeded(_))),
        "the wait followed the job to its new shard: {queued_outcome:?}"
    );
}

/// A move to four shards stopped after recording its epoch on its first
/// new shard only (the command was killed there), then a command with a
/// list of three: it must not record another map under the same epoch
/// (shards 0 and 1 would route by one map, shard 2 by the other); it is
/// refused, saying which move to finish, and the first list finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_recorded_in_part_refuses_another_list_until_it_is_finished() {
    let servers = TestShards::databases(4).await;
    let config = |n: usize| {
        Config::from_toml(
            &ShardList::numbered(&servers.urls[..n])
                .pool_size(12)
                .toml(WORKER_TOML),
        )
        .unwrap()
    };
    shardq::migrate::migrate_all(&ShardSet::connect(&config(2)).unwrap())
        .await
        .unwrap();
    let four = ShardSet::connect(&config(4)).unwrap();
    for i in [2, 3] {
        shardq::migrate::migrate_joining(four.get(i), 4)
            .await
            .unwrap();
    }
    let from = shardq::shard_map::ShardMap::from_formula(2);
    let plan = shardq::reshard::plan(from.ranges(), 4);
    let history = shardq::store::reshard::history(four.get(0)).await.unwrap();
    let record = plan.record(2, 4);
    // What the command writes on its first shard before anything else.
    shardq::store::reshard::record_epoch(
        four.get(2),
        &shardq::store::reshard::EpochWrite {
            record: &record,
            history: Some(&history),
            moving_in: true,
            ids_from: 1 << 40,
            in_list: true,
        },
    )
    .await
    .unwrap();

    let three = ShardSet::connect(&config(3)).unwrap();
    let refused = reshard(&three, 2, 3, &Options::default(), |_| {})
        .await
        .expect_err("another list while a move is recorded in part");
    assert!(
        refused.to_string().contains("list of 4 shards (epoch 2)"),
        "{refused}"
    );
    for i in 0..2 {
        let epochs = shardq::store::reshard::history(three.get(i)).await.unwrap();
        assert_eq!(epochs.len(), 1, "nothing recorded on shard {i}");
    }

    let summary = reshard(&four, 2, 4, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    let map = four.load_map().await.expect("one map on every shard");
    assert_eq!((map.epoch(), map.ranges()), (2, &plan.ranges[..]));
}

/// An enqueue in a REPEATABLE READ transaction whose snapshot was taken
/// before a range was released (another range still moves in, so the hold
/// trigger stays): its snapshot reads the range as moving, and without the
/// release mark the job was written held after the release and stayed held
/// for good. It is refused with 40001 (nothing written), and the
/// transaction run again writes it ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeatable_read_enqueue_older_than_the_release_is_refused_not_held() {
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    assert!(m.plan.moves.len() >= 2, "{:?}", m.plan.moves);
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &opened, |_| {}).await.unwrap();
    let client = Client::new(&m.new).unwrap();
    client.shards().load_map().await.unwrap();
    let first = &m.plan.moves[0];
    let key = (0..)
        .map(|i| format!("late-{i}"))
        .find(|k| {
            let at = shardq::router::shard_key_for(k);
            first.first_key <= at && at < first.end_key
        })
        .unwrap();
    let job = || {
        client
            .route(NewJob::new("moving", "noop", json!({})).ordering_key(key.clone()))
            .unwrap()
    };
    let target = m.all.get(first.to_index);
    let mut db = target.user_client().await.unwrap();
    let tx = repeatable_read(&mut db).await;
    tx.query_one("SELECT count(*) FROM shardq_map_moves", &[])
        .await
        .unwrap(); // the snapshot is taken here

    shardq::store::reshard::release(target, 2, (first.first_key, first.end_key))
        .await
        .unwrap();
    let refused = job()
        .insert(&*tx)
        .await
        .expect_err("a snapshot older than the release");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE),
        "{refused:?}"
    );
    tx.rollback().await.unwrap();

    let tx = repeatable_read(&mut db).await;
    let id = job().insert(&*tx).await.expect("run again");
    tx.commit().await.unwrap();
    let info = client.job(id).await.unwrap().expect("the job");
    assert_eq!(info.status, JobStatus::Queued, "released, not held");
}

/// A schedule's tick on its old shard whose statement passed the ownership
/// check before the new epoch was written, committing only after: the move
/// must copy that tick, or the new shard runs it again. The tick is driven
/// in an open transaction; the move waits for it (the tick holds the map's
/// lock shared), and the schedule's copy on the new shard has it. Before,
/// the move went on, copied the older tick, and the same tick could run
/// on both shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_in_flight_when_the_move_begins_is_copied_with_its_schedule() {
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let name = moving_key(&m.plan, "every-second");
    let shard_key = shardq::router::shard_key_for(&name);
    let old = m.all.get(usize::from(shard_key >= 32_768));
    // Whole microseconds, as the database keeps them.
    let earlier = chrono::DateTime::from_timestamp_micros(
        (chrono::Utc::now() - chrono::Duration::seconds(10)).timestamp_micros(),
    )
    .unwrap();
    old.client()
        .await
        .unwrap()
        .execute(
            "INSERT INTO shardq_schedules (name, last_tick, updated_at) VALUES ($1, $2, now())",
            &[&name, &earlier],
        )
        .await
        .unwrap();
    let tick_at = earlier + chrono::Duration::seconds(5);
    let job = NewJob::new("ticks", "noop", json!({}))
        .dedup(format!("{name}@5"), OnDuplicate::ReturnExisting);
    let mut db = old.user_client().await.unwrap();
    let tx = db.transaction().await.unwrap();
    let outcome = shardq::store::schedules::tick_in(
        &*tx,
        shardq::store::schedules::Tick {
            name: &name,
            at: tick_at,
            shard_key,
            job: &job,
            max_attempts: 3,
            enqueue: true,
        },
    )
    .await
    .unwrap();
    assert!(outcome.advanced && !outcome.moved, "{outcome:?}");

    let moving = tokio::spawn({
        let all = m.all.clone();
        async move { reshard(&all, 2, 3, &Options::default(), |_| {}).await }
    });
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !moving.is_finished(),
        "the move waits for the tick in flight"
    );
    tx.commit().await.unwrap();
    let summary = moving.await.unwrap().unwrap();
    assert!(summary.complete);

    let copied: chrono::DateTime<chrono::Utc> = m
        .all
        .get(2)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT last_tick FROM shardq_schedules WHERE name = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(copied, tick_at, "the new shard knows the tick ran");
}

/// A caller's transaction holding an enqueue open on an old shard (the
/// map's lock shared) while the move records its epoch: the record's
/// exclusive request must not queue that shard's other enqueues behind it
/// for a statement deadline (60 s here). It gives up at the sessions'
/// `lock_timeout` (`database.lock_timeout_ms`, 2 s by default) and is tried
/// again; the other enqueue goes through while the transaction is still
/// open, and the move finishes once it commits. (With `lock_timeout_ms =
/// 0` the enqueue waited behind the record: seen failing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_enqueue_transaction_does_not_stall_the_shard_behind_the_move() {
    let slow = format!("{WORKER_TOML}[database]\nstatement_timeout_ms = 60000\n");
    let m = growing_to_three(TestShards::databases(3).await, &slow).await;
    let client = Client::new(&m.new).unwrap();
    client.shards().load_map().await.unwrap();
    let on_shard_0 = |name: &str| {
        let key = (0..)
            .map(|i| format!("{name}-{i}"))
            .find(|k| shardq::router::shard_key_for(k) < 16_384)
            .unwrap();
        NewJob::new("moving", "noop", json!({})).ordering_key(key)
    };
    let routed = client.route(on_shard_0("open")).unwrap();
    let mut db = routed.shard().user_client().await.unwrap();
    let tx = db.transaction().await.unwrap();
    routed.insert(&*tx).await.unwrap();

    let retried = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let moving = tokio::spawn({
        let (all, retried) = (m.all.clone(), retried.clone());
        async move {
            reshard(&all, 2, 3, &Options::default(), |p| {
                if let shardq::reshard::Progress::Retrying { error } = p {
                    assert!(error.contains("lock timeout"), "{error}");
                    retried.fetch_add(1, Ordering::SeqCst);
                }
            })
            .await
        }
    });
    wait_until(
        Duration::from_secs(20),
        "the record gives up and retries",
        || async { retried.load(Ordering::SeqCst) > 0 },
    )
    .await;
    tokio::time::timeout(Duration::from_secs(10), client.enqueue(on_shard_0("other")))
        .await
        .expect("another enqueue on the shard is not stalled behind the move")
        .unwrap();
    assert!(
        !moving.is_finished(),
        "the move waits for the open transaction"
    );
    tx.commit().await.unwrap();
    let summary = moving.await.unwrap().unwrap();
    assert!(summary.complete);
}

/// The command killed after marking a chunk held on the old shard (nothing
/// copied), and after copying another chunk without removing it from the
/// old shard: run again, it copies each job once and removes it once; a
/// key with more jobs than a chunk (copied in pieces) keeps its ids and its
/// order; a worker then runs every job once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_killed_between_mark_copy_and_removal_copies_each_job_once() {
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let client = Client::new(&m.new).unwrap();
    let keyed = |name: &str, n: usize| -> Vec<NewJob> {
        let key = moving_key(&m.plan, name);
        (0..n)
            .map(|i| NewJob::new("moving", "noop", json!({ "i": i })).ordering_key(key.clone()))
            .collect()
    };
    let marked = client.enqueue_many(keyed("marked", 30)).await.unwrap();
    let unremoved = client.enqueue_many(keyed("copied", 30)).await.unwrap();
    let big = client.enqueue_many(keyed("big", 2_100)).await.unwrap();
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &opened, |_| {}).await.unwrap();
    use shardq::store::reshard as store;
    let one_key = |id: JobId| (id.shard_key, id.shard_key + 1);
    let from_of = |id: JobId| m.all.get(usize::from(id.shard_key >= 32_768));
    store::mark_held(from_of(marked[0]), one_key(marked[0]))
        .await
        .unwrap();
    let from = from_of(unremoved[0]);
    store::mark_held(from, one_key(unremoved[0])).await.unwrap();
    let (jobs, steps) = store::read_held(from, one_key(unremoved[0]), 0, 10_000)
        .await
        .unwrap();
    store::write_copies(m.all.get(2), &jobs, &steps, &json!([]))
        .await
        .unwrap();

    let summary = reshard(&m.all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    let mut rows: HashMap<(i32, i64), Vec<(usize, String)>> = HashMap::new();
    for shard in m.all.all() {
        let db = shard.client().await.unwrap();
        for r in db
            .query("SELECT shard_key, id, status FROM workflow_status", &[])
            .await
            .unwrap()
        {
            let at = (r.get::<_, i32>(0), r.get::<_, i64>(1));
            rows.entry(at).or_default().push((shard.index, r.get(2)));
        }
    }
    for id in marked.iter().chain(&unremoved).chain(&big) {
        let at = rows
            .get(&(id.shard_key, id.id))
            .cloned()
            .unwrap_or_default();
        assert_eq!(at.len(), 1, "job {id} once, on its new shard: {at:?}");
        assert_eq!(at[0].0, 2, "job {id} on its new shard");
    }
    let released = big
        .iter()
        .filter(|id| rows[&(id.shard_key, id.id)][0].1 == "queued")
        .count();
    assert_eq!(
        released,
        big.len(),
        "the big key's jobs released as they were"
    );

    let report = Worker::new(
        m.new.clone(),
        m.all.clone(),
        HandlerRegistry::with_builtins(),
    )
    .stop_when_empty(true)
    .run(CancellationToken::new())
    .await;
    assert_eq!(report.stats.succeeded as usize, 30 + 30 + 2_100);
}

/// With patience set (`shardq reshard --give-up-after`), a shard that stops
/// answering mid-move ends the command with an error instead of a wait;
/// the move stays recorded, and run again once the shard answers, it
/// finishes with every job run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_with_patience_gives_up_on_a_frozen_shard_and_finishes_when_run_again() {
    use nix::sys::signal::Signal;
    let jobs: Vec<NewJob> = (0..600)
        .map(|i| NewJob::new("moving", "noop", json!({ "i": i })))
        .collect();
    let (
        GrowingToThree {
            servers, new, all, ..
        },
        first,
    ) = on_servers_with_jobs(500, jobs).await;
    let patient = Options {
        patience: Some(Duration::from_secs(2)),
        ..Options::default()
    };
    let mut retries = 0;
    // Frozen once the ranges are open, as the copy begins.
    let gave_up = tokio::time::timeout(
        Duration::from_secs(30),
        reshard(&all, 2, 3, &patient, |p| match p {
            shardq::reshard::Progress::Done(Step::Opened) => {
                servers.servers[0]
                    .server()
                    .signal_all(Signal::SIGSTOP)
                    .unwrap();
            }
            shardq::reshard::Progress::Retrying { .. } => retries += 1,
            _ => {}
        }),
    )
    .await;
    servers.servers[0]
        .server()
        .signal_all(Signal::SIGCONT)
        .unwrap();
    let gave_up = gave_up.expect("the command gives up instead of waiting");
    assert!(gave_up.is_err(), "{gave_up:?}");
    assert!(
        retries > 1,
        "it tried again before giving up ({retries}): {gave_up:?}"
    );

    let summary = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    let report = Worker::new(new.clone(), all.clone(), HandlerRegistry::with_builtins())
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    assert_eq!(report.stats.succeeded as usize, first.len());
    assert_eq!(unfinished(&all).await, 0);
}

/// The documented least-privilege producer (docs/least_privilege.sql)
/// enqueues into a range moving in: the hold trigger runs with its rights
/// and reads the map tables and the release mark, which every role may
/// read. (Without the mark's grant it was refused with 42501 for the whole
/// move.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_producer_enqueues_into_a_moving_range() {
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &opened, |_| {}).await.unwrap();
    let target = m.all.get(2);
    let admin = target.client().await.unwrap();
    admin
        .batch_execute(include_str!("../../docs/least_privilege.sql"))
        .await
        .unwrap();
    admin
        .batch_execute("CREATE ROLE app_producer LOGIN IN ROLE shardq_producer")
        .await
        .unwrap();
    let url = m.servers.urls[2].replace("postgres@", "app_producer@");
    let (producer, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let client = Client::new(&m.new).unwrap();
    client.shards().load_map().await.unwrap();
    let job = client
        .route(NewJob::new("moving", "noop", json!({})).ordering_key(moving_key(&m.plan, "lp")))
        .unwrap();
    assert_eq!(job.shard().index, 2);
    let id = job.insert(&producer).await.expect("the producer enqueues");
    let info = client.job(id).await.unwrap().expect("the job");
    assert_eq!(info.status, JobStatus::Held);
}

/// A move to three shards stopped after its epoch was recorded everywhere,
/// then run with a list whose third shard is another server: resuming would
/// copy the rest of the range there while the jobs already moved stay held
/// on the first one. It is refused, naming the shard; the list the move
/// began with finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_resumed_with_another_server_as_its_target_is_refused() {
    let servers = TestShards::databases(4).await;
    let list = |urls: &[&String]| {
        let urls: Vec<String> = urls.iter().map(|u| (*u).clone()).collect();
        Config::from_toml(&ShardList::numbered(&urls).pool_size(12).toml(WORKER_TOML)).unwrap()
    };
    let u = &servers.urls;
    shardq::migrate::migrate_all(&ShardSet::connect(&list(&[&u[0], &u[1]])).unwrap())
        .await
        .unwrap();
    let began = ShardSet::connect(&list(&[&u[0], &u[1], &u[2]])).unwrap();
    let swapped = ShardSet::connect(&list(&[&u[0], &u[1], &u[3]])).unwrap();
    for set in [&began, &swapped] {
        shardq::migrate::migrate_joining(set.get(2), 3)
            .await
            .unwrap();
    }
    let recorded = Options {
        stop_after: Some(Step::Recorded),
        ..Options::default()
    };
    reshard(&began, 2, 3, &recorded, |_| {}).await.unwrap();

    let refused = reshard(&swapped, 2, 3, &Options::default(), |_| {})
        .await
        .expect_err("another server in the target's place");
    assert!(
        refused
            .to_string()
            .contains("is not the shard the unfinished move"),
        "{refused}"
    );
    let summary = reshard(&began, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
}

/// An enqueue in a REPEATABLE READ transaction on the old shard whose
/// snapshot was taken before the new epoch was recorded there: by its
/// snapshot the key is still this shard's, and the job would be written on
/// a shard its range has left (after the release, nothing moves it, and it
/// runs beside its key's jobs on the new shard). It is refused with 40001.
/// (Written there before the map change mark: seen failing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeatable_read_enqueue_older_than_the_epoch_is_refused_on_the_old_shard() {
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let client = Client::new(&m.new).unwrap();
    client.shards().load_map().await.unwrap();
    let key = moving_key(&m.plan, "stale-snapshot");
    let routed = client
        .route(NewJob::new("moving", "noop", json!({})).ordering_key(key))
        .unwrap();
    let old = routed.shard().clone();
    assert!(old.index < 2, "routed by the map of two");
    let mut db = old.user_client().await.unwrap();
    let tx = repeatable_read(&mut db).await;
    tx.query_one("SELECT count(*) FROM shardq_map_epochs", &[])
        .await
        .unwrap(); // the snapshot is taken here
    let recorded = Options {
        stop_after: Some(Step::Recorded),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &recorded, |_| {}).await.unwrap();
    let refused = routed
        .insert(&*tx)
        .await
        .expect_err("a snapshot older than the epoch");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE),
        "{refused:?}"
    );
}
