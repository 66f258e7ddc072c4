//! Workers drain every job exactly once, also while a shard goes down and
//! comes back; an unknown handler fails its job instead of losing it.

use crate::common;

use common::{count_on, count_status, wait_until, TestShards};
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use shardq_local::StopMode;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Small batches and few slots make the eight workers contend for the same rows.
const CONTENDED: &str = "
[dequeue]
slots_per_shard = 2
batch_size = 50
empty_backoff_min_ms = 5
empty_backoff_max_ms = 20
[worker]
queues = [\"q\"]
concurrency = 4
producers = 2
buffer_jobs = 200
completion_flush_ms = 2
";

fn counting_registry(runs: Arc<Mutex<HashMap<String, u32>>>) -> HandlerRegistry {
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("count", move |ctx| {
        let runs = runs.clone();
        async move {
            *runs.lock().unwrap().entry(ctx.id.to_string()).or_default() += 1;
            Ok(serde_json::json!({"ok": true}))
        }
    });
    registry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_on_four_shards_run_every_job_exactly_once() {
    let shards = TestShards::databases(4).await;
    let config = shards.config(CONTENDED);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let jobs: Vec<NewJob> = (0..20_000)
        .map(|i| NewJob::new("q", "count", serde_json::json!({ "i": i })))
        .collect();
    let ids = client.enqueue_many(jobs).await.unwrap();

    let runs = Arc::new(Mutex::new(HashMap::new()));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let set = shardq::shards::ShardSet::connect(&config).unwrap();
        let worker =
            Worker::new(config.clone(), set, counting_registry(runs.clone())).stop_when_empty(true);
        workers.push(tokio::spawn(worker.run(CancellationToken::new())));
    }
    let (mut completed, mut statements) = (0, 0);
    for w in workers {
        let report = tokio::time::timeout(Duration::from_secs(120), w)
            .await
            .expect("workers finish")
            .unwrap();
        assert_eq!(report.stats.fenced, 0);
        completed += report.stats.succeeded;
        statements += report.stats.completion_statements;
    }
    assert_eq!(completed, 20_000);
    // Batched completions: far fewer statements than jobs.
    assert!(
        statements * 4 < completed,
        "{statements} completion statements for {completed} jobs"
    );
    {
        let runs = runs.lock().unwrap();
        assert_eq!(runs.len(), 20_000, "every job ran");
        for id in &ids {
            assert_eq!(runs.get(&id.to_string()), Some(&1), "job {id} ran once");
        }
    }
    assert_eq!(count_status(&set, "succeeded").await, 20_000);
    // Every row was claimed exactly once.
    for shard in set.all() {
        let row = shard
            .client()
            .await
            .unwrap()
            .query_one(
                "SELECT count(*) FROM workflow_status WHERE attempts <> 1",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_shard_does_not_stop_the_others_and_is_drained_after_restart() {
    let shards = TestShards::servers(3).await;
    let config = shards.config(
        "
[dequeue]
batch_size = 20
unhealthy_backoff_min_ms = 100
unhealthy_backoff_max_ms = 500
connect_timeout_ms = 1000
[worker]
queues = [\"q\"]
concurrency = 4
buffer_jobs = 100
",
    );
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("slow", |_ctx| async {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(serde_json::Value::Null)
    });
    let jobs: Vec<NewJob> = (0..3_000)
        .map(|_| NewJob::new("q", "slow", serde_json::json!({})))
        .collect();
    client.enqueue_many(jobs).await.unwrap();

    let shutdown = CancellationToken::new();
    let worker = Worker::new(
        config.clone(),
        shardq::shards::ShardSet::connect(&config).unwrap(),
        registry,
    );
    let stats = worker.stats();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_until(Duration::from_secs(30), "first completions", || {
        let stats = stats.clone();
        async move { stats.snapshot().succeeded >= 100 }
    })
    .await;

    shards.servers[1].stop(StopMode::Immediate).unwrap();
    let (s0, s2) = (set.get(0).clone(), set.get(2).clone());
    wait_until(Duration::from_secs(60), "shards 0 and 2 drained", || {
        let (s0, s2) = (s0.clone(), s2.clone());
        async move {
            count_on(&s0, "queued").await.unwrap() + count_on(&s0, "running").await.unwrap() == 0
                && count_on(&s2, "queued").await.unwrap() + count_on(&s2, "running").await.unwrap()
                    == 0
        }
    })
    .await;
    assert!(
        stats.snapshot().claim_errors > 0,
        "the stopped shard was tried and failed"
    );
    assert!(
        !running.is_finished(),
        "the worker keeps running with a shard down"
    );

    shards.servers[1].start_again().unwrap();
    let set_probe = set.clone();
    wait_until(Duration::from_secs(60), "every job succeeded", || {
        let set = set_probe.clone();
        async move { count_status(&set, "succeeded").await == 3_000 }
    })
    .await;
    assert!(!running.is_finished());
    shutdown.cancel();
    let report = running.await.unwrap();
    assert_eq!(report.stats.succeeded, 3_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_for_an_unknown_handler_fails_with_a_clear_error() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("[worker]\nqueues = [\"q\"]\n");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let id = client
        .enqueue(NewJob::new("q", "no-such-handler", serde_json::json!({})).max_attempts(1))
        .await
        .unwrap();
    let report = Worker::new(config, set.clone(), HandlerRegistry::with_builtins())
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    assert_eq!(report.stats.dead, 1);
    let row = set
        .for_key(id.shard_key)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT status, error FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "dead");
    assert!(row
        .get::<_, String>(1)
        .contains("no handler is registered under the name `no-such-handler`"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_counts_per_shard_and_records_latencies() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("[worker]\nqueues = [\"q\"]\n");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let jobs: Vec<NewJob> = (0..400)
        .map(|_| NewJob::new("q", "noop", serde_json::json!({})))
        .collect();
    client.enqueue_many(jobs).await.unwrap();
    let worker =
        Worker::new(config, set.clone(), HandlerRegistry::with_builtins()).stop_when_empty(true);
    let stats = worker.stats();
    worker.run(CancellationToken::new()).await;
    let per_shard = stats.shards();
    assert_eq!(per_shard.len(), 2);
    for (i, shard) in per_shard.iter().enumerate() {
        let rows = count_on(set.get(i), "succeeded").await.unwrap() as u64;
        assert_eq!(shard.claimed, rows, "shard {i} claimed count");
        assert_eq!(shard.completed, rows, "shard {i} completed count");
    }
    let latencies = stats.latencies();
    assert_eq!(latencies.pickup_us.len(), 400);
    assert_eq!(latencies.completion_lag_us.len(), 400);
    let statements: u64 = latencies.claim_statement_us.iter().map(|h| h.len()).sum();
    let snap = stats.snapshot();
    assert_eq!(
        statements,
        snap.claim_statements + snap.empty + snap.busy + snap.claim_errors
    );
}

/// `stop_when_empty` waits for a job that failed and waits out its retry
/// backoff (scheduled again, not queued): it stopped with the job still to
/// run before, because its empty check looked only at queued and running
/// jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_when_empty_waits_for_a_retrying_job() {
    let shards = TestShards::databases(1).await;
    let config = shards.config(
        "[worker]\nqueues = [\"q\"]\nretry_backoff_min_ms = 1500\nretry_backoff_max_ms = 1500\n",
    );
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let mut registry = HandlerRegistry::with_builtins();
    let counter = runs.clone();
    registry.register("flaky", move |_ctx| {
        let runs = counter.clone();
        async move {
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err("first attempt fails".into());
            }
            Ok(serde_json::Value::Null)
        }
    });
    client
        .enqueue(NewJob::new("q", "flaky", serde_json::json!({})))
        .await
        .unwrap();
    let report = Worker::new(config, set.clone(), registry)
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the retry ran before the worker stopped"
    );
    assert_eq!((report.stats.retrying, report.stats.succeeded), (1, 1));
    assert_eq!(count_on(set.get(0), "succeeded").await.unwrap(), 1);
}
