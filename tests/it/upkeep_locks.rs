//! One held key lock must not stop a shard's upkeep. A second session holds
//! one key's lock inside an open transaction (what a frozen worker's backend,
//! `idle in transaction`, does): recovery returns every other expired job,
//! and due scheduled jobs are still promoted, pass after pass. And a session
//! of shardq's own left idle inside a transaction is cut off by the server,
//! so the locks it holds do not outlive the deadline.

use crate::common;

use common::{count_status, wait_until, TestShards};
use serde_json::json;
use shardq::config::DequeueMode;
use shardq::shards::Shard;
use shardq::store::jobs::{self, Claim, ClaimParams};
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Keys with three running jobs each, and unkeyed running jobs.
const KEYS: usize = 40;
const PER_KEY: usize = 3;
const UNKEYED: usize = 20;
/// Due scheduled jobs (half of them keyed) that must be promoted meanwhile.
const SCHEDULED: usize = 10;

/// The worker serves another queue: it only does upkeep on queue `q`.
const UPKEEP_ONLY: &str = "
[worker]
queues = [\"elsewhere\"]
maintenance_interval_ms = 200
";

async fn running_keys(shard: &Shard) -> Vec<Option<String>> {
    let db = shard.client().await.unwrap();
    db.query(
        "SELECT DISTINCT ordering_key FROM workflow_status WHERE status = 'running'",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_lock_stops_neither_recovery_of_other_jobs_nor_promotion() {
    let dbs = TestShards::databases(1).await;
    let config = dbs.config(UPKEEP_ONLY);
    let set = dbs.migrated(&config).await;
    let shard = set.get(0);
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let mut batch = Vec::new();
    for k in 0..KEYS {
        for _ in 0..PER_KEY {
            batch.push(NewJob::new("q", "noop", json!({})).ordering_key(format!("k{k}")));
        }
    }
    for _ in 0..UNKEYED {
        batch.push(NewJob::new("q", "noop", json!({})));
    }
    client.enqueue_many(batch).await.unwrap();

    // A worker that froze: it claimed everything with a lease that is over
    // at once.
    let params = ClaimParams {
        queue: "q",
        limit: 1_000,
        owner: "frozen",
        lease: Duration::from_millis(1),
        mode: DequeueMode::Gated { slots: 2 },
    };
    let Claim::Jobs(claimed) = jobs::claim(shard, params).await.unwrap() else {
        panic!("the claim found the jobs");
    };
    assert_eq!(claimed.len(), KEYS * PER_KEY + UNKEYED);
    let mut due = Vec::new();
    for i in 0..SCHEDULED {
        let job = NewJob::new("q", "noop", json!({})).delay(Duration::from_millis(50));
        due.push(if i % 2 == 0 {
            job.ordering_key(format!("s{i}"))
        } else {
            job
        });
    }
    client.enqueue_many(due).await.unwrap();

    // Its backend holds key k0's lock, idle in a transaction.
    let mut frozen = shard.user_client().await.unwrap();
    let held = frozen.transaction().await.unwrap();
    held.execute(
        "SELECT pg_advisory_xact_lock(shardq_key_lock('q', 'k0'))",
        &[],
    )
    .await
    .unwrap();

    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(
            config.clone(),
            set.clone(),
            HandlerRegistry::with_builtins(),
        )
        .run(stop.clone()),
    );
    wait_until(
        Duration::from_secs(30),
        "every job but the held key's recovered, every due job promoted",
        || {
            let set = set.clone();
            async move {
                count_status(&set, "running").await == PER_KEY as i64
                    && count_status(&set, "scheduled").await == 0
            }
        },
    )
    .await;
    assert_eq!(
        running_keys(shard).await,
        vec![Some("k0".to_string())],
        "only the held key's jobs wait for its lock"
    );
    assert_eq!(
        count_status(&set, "queued").await + count_status(&set, "waiting").await,
        (KEYS * PER_KEY + UNKEYED + SCHEDULED - PER_KEY) as i64
    );

    // Once the frozen backend lets go, its key comes back too.
    held.commit().await.unwrap();
    wait_until(
        Duration::from_secs(30),
        "the held key recovered once its lock is free",
        || {
            let set = set.clone();
            async move { count_status(&set, "running").await == 0 }
        },
    )
    .await;
    stop.cancel();
    worker.await.unwrap();
}

/// A shardq session that stops talking inside a transaction (its process
/// froze, or the network between them broke) is ended by the server after
/// the idle-in-transaction timeout, and its key lock is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shardq_session_idle_in_a_transaction_lets_go_of_its_locks() {
    let dbs = TestShards::databases(1).await;
    let config = dbs.config("[dequeue]\nstatement_timeout_ms = 1000\n");
    let set = dbs.migrated(&config).await;
    let shard = set.get(0);

    let mut own = shard.client().await.unwrap();
    let settings = own
        .query_one(
            "SELECT current_setting('idle_in_transaction_session_timeout'), \
                    current_setting('tcp_keepalives_idle')",
            &[],
        )
        .await
        .unwrap();
    let (idle, keepalive): (String, String) = (settings.get(0), settings.get(1));
    assert_eq!(idle, "2s", "twice the statement deadline");
    assert_eq!(keepalive, "10", "keepalives probe an idle peer after 10 s");

    let tx = own.transaction().await.unwrap();
    tx.execute(
        "SELECT pg_advisory_xact_lock(shardq_key_lock('q', 'k0'))",
        &[],
    )
    .await
    .unwrap();
    let other = shard.user_client().await.unwrap();
    let free = || async {
        other
            .query_one(
                "SELECT pg_try_advisory_xact_lock(shardq_key_lock('q', 'k0'))",
                &[],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
    };
    assert!(!free().await, "the open transaction holds the lock");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        free().await,
        "the server ended the idle transaction and freed its lock"
    );
    drop(tx);
}
