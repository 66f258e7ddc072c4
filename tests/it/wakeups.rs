//! Wake-ups: a statement that makes jobs ready notifies `shardq_ready` with
//! the queue's name, once per transaction and queue however many jobs it
//! writes; delayed jobs notify when they become due.

use crate::common;

use common::TestShards;
use shardq::store::upkeep;
use shardq::{Client, NewJob};
use std::time::Duration;

/// Every payload that arrives within `wait`.
async fn drain(
    payloads: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    wait: Duration,
) -> Vec<String> {
    let mut got = Vec::new();
    while let Ok(Some(p)) = tokio::time::timeout(wait, payloads.recv()).await {
        got.push(p);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_jobs_notify_once_per_statement_and_queue() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let shard = set.get(0);
    let mut listener = shard
        .listen("shardq_ready")
        .await
        .unwrap()
        .expect("a direct connection listens");

    // 1,000 jobs of two queues in one call (one statement on the one shard).
    let jobs = (0..1_000)
        .map(|i| {
            NewJob::new(
                if i % 2 == 0 { "a" } else { "b" },
                "noop",
                serde_json::json!({}),
            )
        })
        .collect();
    client.enqueue_many(jobs).await.unwrap();
    let mut got = drain(&mut listener.payloads, Duration::from_millis(500)).await;
    got.sort();
    assert_eq!(got, vec!["a".to_string(), "b".to_string()]);

    // A delayed job says nothing until it is due and promoted.
    client
        .enqueue(
            NewJob::new("later", "noop", serde_json::json!({})).delay(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    assert!(drain(&mut listener.payloads, Duration::from_millis(300))
        .await
        .is_empty());
    assert_eq!(upkeep::promote_due(shard, 10).await.unwrap(), 1);
    assert_eq!(
        drain(&mut listener.payloads, Duration::from_millis(500)).await,
        vec!["later".to_string()]
    );
}

/// With the fallback poll pushed out to a minute, an idle worker still
/// starts a new job, and the next job of a key freed by a completion, within
/// seconds: only the wake-ups can have told it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_wakes_for_a_new_job_and_for_a_freed_key() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("[dequeue]\nidle_poll_ms = 60000\n\n[worker]\nqueues = [\"q\"]\n");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let mut handlers = shardq::HandlerRegistry::with_builtins();
    handlers.register("slow", |_ctx| async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(serde_json::Value::Null)
    });
    let shutdown = tokio_util::sync::CancellationToken::new();
    let worker = shardq::Worker::new(config.clone(), set.clone(), handlers);
    let running = tokio::spawn(worker.run(shutdown.clone()));
    // Every target polled empty once and is now skipped for 30-60 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let id = client
        .enqueue(NewJob::new("q", "noop", serde_json::json!({})))
        .await
        .unwrap();
    let outcome = client.result(id, Duration::from_secs(10)).await;
    assert!(
        matches!(outcome, Ok(shardq::JobOutcome::Succeeded(_))),
        "{outcome:?}"
    );

    // The second job of a key arrives while the first runs: it is parked,
    // and queued again when the first completes (no enqueue then).
    let first = client
        .enqueue(NewJob::new("q", "slow", serde_json::json!({})).ordering_key("k"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = client
        .enqueue(NewJob::new("q", "noop", serde_json::json!({})).ordering_key("k"))
        .await
        .unwrap();
    for id in [first, second] {
        let outcome = client.result(id, Duration::from_secs(10)).await;
        assert!(
            matches!(outcome, Ok(shardq::JobOutcome::Succeeded(_))),
            "{id}: {outcome:?}"
        );
    }
    shutdown.cancel();
    running.await.unwrap();
}

/// Under a trickle of jobs, a claim that took fewer jobs than it asked for
/// is not followed by another claim at once (it would find nothing, or a
/// job or two): the target waits for its next wake-up. Without that, every
/// job cost a claim that found it and one that came back empty; under a
/// steady offer those claims kept the servers' CPU busy (`bench scale --rate`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caught_up_target_waits_for_its_next_wake_up() {
    const JOBS: usize = 60;
    let shards = TestShards::databases(1).await;
    let config = shards.config("[dequeue]\nidle_poll_ms = 60000\n\n[worker]\nqueues = [\"q\"]\n");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let worker = shardq::Worker::new(
        config.clone(),
        set.clone(),
        shardq::HandlerRegistry::with_builtins(),
    );
    let stats = worker.stats();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    // Every producer polled the empty target once and now waits for wake-ups.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = stats.snapshot();

    let mut ids = Vec::new();
    for _ in 0..JOBS {
        let id = client
            .enqueue(NewJob::new("q", "noop", serde_json::json!({})))
            .await
            .unwrap();
        ids.push(id);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for id in ids {
        let outcome = client.result(id, Duration::from_secs(10)).await;
        assert!(
            matches!(outcome, Ok(shardq::JobOutcome::Succeeded(_))),
            "{outcome:?}"
        );
    }
    let after = stats.snapshot();
    shutdown.cancel();
    running.await.unwrap();
    let claims = after.claim_statements - before.claim_statements;
    let empty = after.empty - before.empty;
    assert!(claims > 0 && claims <= JOBS as u64, "{claims} claims");
    assert!(
        empty * 4 < claims,
        "{empty} empty claims for {claims} that found jobs: a caught-up target was claimed again at once"
    );
}

/// A delayed job starts when it falls due, not at the next maintenance
/// pass: with passes 20 s apart, a job due in 1 s and one due in 3 s both
/// finish within a few seconds of their due times. Before, they waited for
/// a pass (10-20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_job_starts_when_due_not_at_the_next_maintenance_pass() {
    let shards = TestShards::databases(1).await;
    let config = shards.config(
        "[dequeue]\nidle_poll_ms = 60000\n\n[worker]\nqueues = [\"q\"]\nmaintenance_interval_ms = 20000\n",
    );
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let worker = shardq::Worker::new(
        config.clone(),
        set.clone(),
        shardq::HandlerRegistry::with_builtins(),
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let started = std::time::Instant::now();
    let first = client
        .enqueue(NewJob::new("q", "noop", serde_json::json!({})).delay(Duration::from_secs(1)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = client
        .enqueue(NewJob::new("q", "noop", serde_json::json!({})).delay(Duration::from_secs(3)))
        .await
        .unwrap();
    for id in [first, second] {
        let outcome = client.result(id, Duration::from_secs(30)).await;
        assert!(
            matches!(outcome, Ok(shardq::JobOutcome::Succeeded(_))),
            "{id}: {outcome:?}"
        );
    }
    let took = started.elapsed();
    shutdown.cancel();
    running.await.unwrap();
    assert!(
        took < Duration::from_secs(8),
        "the delayed jobs waited {took:?}: for a maintenance pass, not their due times"
    );
}
