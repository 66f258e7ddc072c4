//! The release of a silent worker's jobs, step by step on one shard: it is
//! judged against the releaser's own previous beat (a shard that did not
//! answer for a while makes every row old, and that is no one's death), it
//! only tries key locks (a held key's job waits, the others come back), and
//! the silent worker's row stays until all its jobs are back.

use crate::common;

use common::TestShards;
use serde_json::json;
use shardq::config::DequeueMode;
use shardq::shards::Shard;
use shardq::store::jobs::{self, Claim, ClaimParams};
use shardq::store::workers::{self, Released};
use shardq::{Client, NewJob};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(15);

/// Writes worker `id`'s row with a heartbeat `age_s` seconds old.
async fn beat(shard: &Shard, id: &str, age_s: f64) {
    shard
        .client()
        .await
        .unwrap()
        .execute(
            "INSERT INTO shardq_workers (worker_id, host, pid, queues, started_at, heartbeat_at) \
             VALUES ($1, 'h', 1, '{q}', now() - interval '1 hour', now() - $2 * interval '1 second') \
             ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at",
            &[&id, &age_s],
        )
        .await
        .unwrap();
}

/// (status, owner, attempts, fence) of every job, in id order.
async fn jobs_now(shard: &Shard) -> Vec<(String, Option<String>, i32, i64)> {
    let db = shard.client().await.unwrap();
    db.query(
        "SELECT status, owner, attempts, fence FROM workflow_status ORDER BY id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

async fn rows_of(shard: &Shard, id: &str) -> i64 {
    let db = shard.client().await.unwrap();
    db.query_one(
        "SELECT count(*) FROM shardq_workers WHERE worker_id = $1",
        &[&id],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_workers_jobs_come_back_key_by_key_judged_by_the_releasers_last_beat() {
    let dbs = TestShards::databases(1).await;
    let config = dbs.config("");
    let set = dbs.migrated(&config).await;
    let shard = set.get(0);
    let client = Client::from_shards(set.clone(), config.limits.clone());
    client
        .enqueue_many(vec![
            NewJob::new("q", "noop", json!({})).ordering_key("K1"),
            NewJob::new("q", "noop", json!({})).ordering_key("K2"),
            NewJob::new("q", "noop", json!({})),
            NewJob::new("q", "noop", json!({})),
        ])
        .await
        .unwrap();
    let params = ClaimParams {
        queue: "q",
        limit: 10,
        owner: "ghost",
        lease: Duration::from_secs(600),
        mode: DequeueMode::Gated { slots: 2 },
    };
    let Claim::Jobs(claimed) = jobs::claim(shard, params).await.unwrap() else {
        panic!("claimed");
    };
    assert_eq!(claimed.len(), 4);
    beat(shard, "ghost", 60.0).await;
    let release = || workers::release_silent(shard, "me", TTL, 100);

    // No beat of mine yet: I know nothing of the shard's past.
    assert_eq!(release().await.unwrap(), Released::default());
    // My last beat was 50 s ago, the ghost's 60 s ago: the shard may have
    // been unreachable in between, for both of us.
    beat(shard, "me", 50.0).await;
    assert_eq!(release().await.unwrap(), Released::default());
    assert!(jobs_now(shard).await.iter().all(|j| j.0 == "running"));

    // I beat a second ago; the ghost missed every beat since. K1's lock is
    // held by a frozen session: its job waits, the others come back.
    beat(shard, "me", 1.0).await;
    let mut frozen = shard.user_client().await.unwrap();
    let held = frozen.transaction().await.unwrap();
    held.execute(
        "SELECT pg_advisory_xact_lock(shardq_key_lock('q', 'K1'))",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        release().await.unwrap(),
        Released {
            jobs: 3,
            workers: 0
        }
    );
    let now = jobs_now(shard).await;
    assert_eq!(now[0], ("running".into(), Some("ghost".into()), 1, 1));
    for job in &now[1..] {
        assert_eq!(
            job,
            &("queued".into(), None, 1, 2),
            "kept its attempt, fenced"
        );
    }
    assert_eq!(rows_of(shard, "ghost").await, 1, "it still holds a job");

    held.commit().await.unwrap();
    assert_eq!(
        release().await.unwrap(),
        Released {
            jobs: 1,
            workers: 1
        }
    );
    assert_eq!(jobs_now(shard).await[0], ("queued".into(), None, 1, 2));
    assert_eq!(rows_of(shard, "ghost").await, 0);
    assert_eq!(rows_of(shard, "me").await, 1);
}
