//! A shard that stops answering without closing its connections (its
//! PostgreSQL processes SIGSTOPped, as a hung host looks to a client) must not
//! cost the healthy shards anything: their leases stay alive, so no job there
//! is recovered or run twice, and the frozen shard's jobs run once it answers
//! again. Before, the leaser awaited every shard together, so one frozen shard
//! let the healthy shards' leases expire.

use crate::common;

use common::{count_on, wait_until, TestShards};
use nix::sys::signal::Signal;
use shardq::store::upkeep;
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Jobs outlive their lease, so they live only while the leaser extends them.
const WORKER: &str = "
[dequeue]
statement_timeout_ms = 1000
lock_timeout_ms = 500
connect_timeout_ms = 1000
unhealthy_backoff_min_ms = 100
unhealthy_backoff_max_ms = 500
empty_backoff_min_ms = 5
empty_backoff_max_ms = 20
[worker]
queues = [\"f\"]
concurrency = 16
lease_ms = 1500
maintenance_interval_ms = 100
";

const JOBS: usize = 24;
const FREEZE: Duration = Duration::from_secs(6);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_shard_costs_the_healthy_one_no_lease() {
    let shards = TestShards::servers(2).await;
    let config = shards.config(WORKER);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let jobs = (0..JOBS)
        .map(|_| NewJob::new("f", "sleep", serde_json::json!({ "ms": 3000 })))
        .collect();
    client.enqueue_many(jobs).await.unwrap();
    let (healthy, frozen) = (set.get(0), set.get(1));
    assert!(count_on(healthy, "queued").await.unwrap() > 0);
    assert!(count_on(frozen, "queued").await.unwrap() > 0);

    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(config, set.clone(), HandlerRegistry::with_builtins()).run(stop.clone()),
    );
    wait_until(
        Duration::from_secs(20),
        "jobs running on both shards",
        || async {
            count_on(healthy, "running").await.unwrap_or(0) > 0
                && count_on(frozen, "running").await.unwrap_or(0) > 0
        },
    )
    .await;

    // Freeze the second shard; meanwhile, act as another process's recovery on
    // the healthy one: a lease that lapsed there would be taken back.
    shards.servers[1]
        .server()
        .signal_all(Signal::SIGSTOP)
        .unwrap();
    let started = Instant::now();
    let mut recovered_on_healthy = 0;
    while started.elapsed() < FREEZE {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = upkeep::recover_expired(healthy, 1000).await.unwrap();
        recovered_on_healthy += r.requeued + r.dead + r.cancelled;
    }
    shards.servers[1]
        .server()
        .signal_all(Signal::SIGCONT)
        .unwrap();
    assert_eq!(
        recovered_on_healthy, 0,
        "leases on the healthy shard lapsed while the other shard was frozen"
    );

    wait_until(Duration::from_secs(60), "every job succeeded", || async {
        let a = count_on(healthy, "succeeded").await.unwrap_or(0);
        let b = count_on(frozen, "succeeded").await.unwrap_or(0);
        a + b == JOBS as i64
    })
    .await;
    stop.cancel();
    worker.await.unwrap();
    let db = healthy.client().await.unwrap();
    let reruns: i64 = db
        .query_one(
            "SELECT count(*) FROM workflow_status WHERE attempts <> 1 OR fence <> 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(reruns, 0, "a job on the healthy shard ran more than once");
}

/// A statement cut off by its deadline leaves its connection waiting for a
/// reply; that connection must be closed, not lent to the next statement.
/// Here one server process stops answering (SIGSTOP of the backend of the
/// pool's only connection) while the server itself is fine: the next
/// statement must get a new connection and an answer. Lent again, the
/// stuck connection would fail every later statement of this process on
/// the shard until that backend woke up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_off_mid_statement_is_closed_not_lent_again() {
    let shards = TestShards::databases(1).await;
    let toml = shards
        .toml(
            "[dequeue]\nstatement_timeout_ms = 1000\nlock_timeout_ms = 500\nconnect_timeout_ms = 1000\n",
        )
        .replace("pool_size = 12", "pool_size = 1");
    let config = shardq::Config::from_toml(&toml).unwrap();
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let pid: i32 = set
        .get(0)
        .client()
        .await
        .unwrap()
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let backend = nix::unistd::Pid::from_raw(pid);
    // Waits for the pool's one connection, cleaned after that checkout.
    assert!(!client.has_pending("q").await.unwrap());
    nix::sys::signal::kill(backend, Signal::SIGSTOP).unwrap();
    let cut_off = client.has_pending("q").await;
    let next = client.has_pending("q").await;
    nix::sys::signal::kill(backend, Signal::SIGCONT).unwrap();
    assert!(
        cut_off.is_err(),
        "the stopped backend cannot answer in time"
    );
    assert!(
        !next.expect("the next statement runs on a new connection"),
        "nothing is pending"
    );
}
