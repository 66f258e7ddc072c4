//! A run that lost its lease while it stalled (its process stopped, so
//! its leaser renewed nothing) and then goes on: at its next step it reads
//! the step log again, finds the step the new owner recorded meanwhile
//! and returns that output without running the step's work again. (A run
//! answers its steps from the log it read at its first step only while
//! its lease runs: no other claim can record a step before then.)
//!
//! The stalled worker is this test binary run again with
//! `SHARDQ_TEST_ROLE`, stopped with SIGSTOP and continued with SIGCONT.

use crate::common;

use common::{child_test, wait_until, TestShards};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use shardq::shards::ShardSet;
use shardq::{Client, Config, HandlerRegistry, NewJob, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const WORKER_TOML: &str = "
[dequeue]
empty_backoff_min_ms = 5
empty_backoff_max_ms = 20
[worker]
queues = [\"wf\"]
lease_ms = 1500
maintenance_interval_ms = 200
";

/// Two steps, each recording its side effect in `test_effects`; the first
/// attempt pauses 3 s between them (the test stops its process there) and
/// notes what its second step returned (or its error) in `test_seen`.
fn two_steps(shards: ShardSet) -> HandlerRegistry {
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("two", move |ctx| {
        let shards = shards.clone();
        async move {
            let db = shards.for_key(ctx.id.shard_key).client().await?;
            for step in ["one", "two"] {
                if step == "two" && ctx.attempt == 1 {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                let (db, id, attempt) = (&db, ctx.id, ctx.attempt);
                let output: Result<String, _> = ctx
                    .step(step, || async move {
                        db.execute("INSERT INTO test_effects VALUES ($1, $2)", &[&id.id, &step])
                            .await?;
                        Ok(format!("{step} by attempt {attempt}"))
                    })
                    .await;
                if step == "two" && ctx.attempt == 1 {
                    let seen = match &output {
                        Ok(text) => text.clone(),
                        Err(e) => format!("error: {e}"),
                    };
                    db.execute("INSERT INTO test_seen VALUES ($1)", &[&seen])
                        .await?;
                }
                output?;
            }
            Ok(serde_json::json!("done"))
        }
    });
    registry
}

/// The worker that stalls; does nothing in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lease_steps_stalled_worker_process() {
    let Some(config) = child_test::config_as("stalled") else {
        return;
    };
    let shards = ShardSet::connect(&config).unwrap();
    Worker::new(config, shards.clone(), two_steps(shards))
        .run(CancellationToken::new())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_lost_its_lease_returns_the_new_owners_step_without_running_it() {
    if child_test::is_child() {
        return;
    }
    stalled_run_returns_the_new_owners_step(WORKER_TOML).await;
}

/// Leases of a minute: the stalled worker's job goes to the survivor
/// because its heartbeats stopped (`HEARTBEAT_TTL`, 15 s), well before its
/// lease ends. A first claim's empty log, and any miss, is trusted 10 s at
/// most, so the stalled run reads the log again all the same.
const LONG_LEASE_TOML: &str = "
[dequeue]
empty_backoff_min_ms = 5
empty_backoff_max_ms = 20
[worker]
queues = [\"wf\"]
lease_ms = 60000
maintenance_interval_ms = 200
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_worker_was_judged_silent_returns_the_new_owners_step_without_running_it() {
    if child_test::is_child() {
        return;
    }
    stalled_run_returns_the_new_owners_step(LONG_LEASE_TOML).await;
}

/// The worker of a first claim stops between its two steps (SIGSTOP); a
/// survivor takes the workflow over and runs it to the end; then the
/// stalled run goes on, and must return the survivor's step two.
async fn stalled_run_returns_the_new_owners_step(worker_toml: &str) {
    let shards = TestShards::databases(1).await;
    let toml = shards.toml(worker_toml);
    let config = Config::from_toml(&toml).unwrap();
    let set = shards.migrated(&config).await;
    let shard = set.get(0).clone();
    shard
        .client()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE test_effects (job bigint, step text); CREATE TABLE test_seen (what text)",
        )
        .await
        .unwrap();
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let id = client
        .enqueue(NewJob::new("wf", "two", serde_json::json!({})))
        .await
        .unwrap();

    let mut stalled = child_test::spawn(
        "lost_lease_steps::lost_lease_steps_stalled_worker_process",
        "stalled",
        &toml,
    );
    let pid = Pid::from_raw(stalled.id().unwrap() as i32);
    let _reaper = KillOnDrop(pid);
    let count = |sql: &'static str| {
        let shard = shard.clone();
        async move {
            let db = shard.client().await.unwrap();
            db.query_one(sql, &[]).await.unwrap().get::<_, i64>(0)
        }
    };
    wait_until(Duration::from_secs(30), "step one recorded", || async {
        count("SELECT count(*) FROM workflow_steps").await > 0
    })
    .await;
    kill(pid, Signal::SIGSTOP).unwrap();

    // Its lease runs out unrenewed, or its heartbeats stop; this worker
    // takes the workflow over and runs it to the end: step one from the
    // log, step two run again.
    let survivor = Worker::new(
        config.clone(),
        ShardSet::connect(&config).unwrap(),
        two_steps(set.clone()),
    );
    let stop = CancellationToken::new();
    let running = tokio::spawn(survivor.run(stop.clone()));
    let outcome = client.result(id, Duration::from_secs(60)).await.unwrap();
    stop.cancel();
    running.await.unwrap();
    assert_eq!(
        outcome,
        shardq::client::JobOutcome::Succeeded(serde_json::json!("done"))
    );

    kill(pid, Signal::SIGCONT).unwrap();
    wait_until(
        Duration::from_secs(30),
        "the stalled run reached its second step",
        || async { count("SELECT count(*) FROM test_seen").await > 0 },
    )
    .await;
    kill(pid, Signal::SIGKILL).unwrap();
    stalled.wait().await.unwrap();

    let db = shard.client().await.unwrap();
    let seen: String = db
        .query_one("SELECT what FROM test_seen", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        seen, "two by attempt 2",
        "the stalled run returned the new owner's output"
    );
    let effects: Vec<(String, i64)> = db
        .query(
            "SELECT step, count(*) FROM test_effects GROUP BY step ORDER BY step",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        effects,
        vec![("one".into(), 1), ("two".into(), 1)],
        "the stalled run did not run step two's work again"
    );
}

/// Kills the child process when the test ends, passed or not (a stopped
/// child left behind would hold the test's output open).
struct KillOnDrop(Pid);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGKILL);
    }
}
