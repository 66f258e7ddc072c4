//! A promotion of due jobs that runs between the claim's statements must not
//! strand a key. `shardq_claim_keyed` decides in one statement that a key is
//! busy (its retrying job is `scheduled`) and parks the key's queued jobs in
//! a later one. A promotion that queued the retrying job in between used to
//! be parked with them: the key was left with `waiting` jobs only, and
//! nothing ever queued it again.
//!
//! The claim is held between those statements by a trigger that waits for a
//! lock this test holds, when the claim marks its jobs `running` (after the
//! "busy?" statement, before the park).

use crate::common;

use common::{wait_until, TestShards};
use serde_json::json;
use shardq::config::DequeueMode;
use shardq::job::ClaimedJob;
use shardq::shards::Shard;
use shardq::store::jobs::{self, Claim, ClaimParams};
use shardq::store::upkeep;
use shardq::{Client, JobId, NewJob};
use std::time::Duration;

/// Makes a claim wait, when it marks a job running, for the lock
/// 7077077 (which the test holds while it runs the promotion).
const PAUSE_CLAIM: &str = "
    CREATE FUNCTION pause_claim() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.status = 'running' AND OLD.status <> 'running' THEN
            PERFORM pg_advisory_xact_lock_shared(7077077);
        END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER pause_claim BEFORE UPDATE ON workflow_status
        FOR EACH ROW EXECUTE FUNCTION pause_claim();";

/// Keys with `waiting` jobs and no running, queued or scheduled job: nothing
/// will ever queue them again.
const STRANDED_KEYS: &str = "SELECT DISTINCT w.ordering_key FROM workflow_status w \
    WHERE w.status = 'waiting' AND NOT EXISTS ( \
        SELECT 1 FROM workflow_status a \
        WHERE a.queue = w.queue AND a.ordering_key = w.ordering_key \
          AND a.status IN ('running', 'queued', 'scheduled'))";

async fn claim(shard: &Shard, owner: &str) -> Vec<ClaimedJob> {
    let params = ClaimParams {
        queue: "q",
        limit: 10,
        owner,
        lease: Duration::from_secs(60),
        mode: DequeueMode::Gated { slots: 2 },
    };
    match jobs::claim(shard, params).await.unwrap() {
        Claim::Jobs(jobs) => jobs,
        Claim::Empty => Vec::new(),
        Claim::HeldBack(jobs) => jobs,
        Claim::Busy => panic!("no other claimer holds a slot"),
    }
}

async fn stranded(shard: &Shard) -> Vec<String> {
    let db = shard.client().await.unwrap();
    db.query(STRANDED_KEYS, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Promotion with the upkeep gate free (nothing else runs upkeep here).
async fn promote(shard: &Shard) -> u64 {
    upkeep::promote_due(shard, 100).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_between_the_busy_check_and_the_park_strands_no_key() {
    let dbs = TestShards::databases(1).await;
    // The paused claim waits for a lock; no lock_timeout cuts it short.
    let config = dbs.config("[dequeue]\nlock_timeout_ms = 0\n");
    let set = dbs.migrated(&config).await;
    let shard = set.get(0).clone();
    let client = Client::from_shards(set.clone(), config.limits.clone());
    // Key K: its retrying job (scheduled, due soon) and a later queued job.
    let retrying: JobId = client
        .enqueue(
            NewJob::new("q", "noop", json!({}))
                .ordering_key("K")
                .delay(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    let later = client
        .enqueue(NewJob::new("q", "noop", json!({})).ordering_key("K"))
        .await
        .unwrap();
    // An unkeyed job, so that the claim marks a row running (and pauses).
    let unkeyed = client
        .enqueue(NewJob::new("q", "noop", json!({})))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let db = shard.client().await.unwrap();
    db.batch_execute(PAUSE_CLAIM).await.unwrap();

    let mut pauser = shard.user_client().await.unwrap();
    let pause = pauser.transaction().await.unwrap();
    pause
        .execute("SELECT pg_advisory_xact_lock(7077077)", &[])
        .await
        .unwrap();
    let claimer = {
        let shard = shard.clone();
        tokio::spawn(async move { claim(&shard, "w1").await })
    };
    // The claim has decided that K is busy and waits in the trigger.
    wait_until(
        Duration::from_secs(30),
        "the claim paused before its park",
        || {
            let shard = shard.clone();
            async move {
                let db = shard.client().await.unwrap();
                let waiting: i64 = db
                    .query_one(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                waiting == 1
            }
        },
    )
    .await;
    // The promotion runs (and commits, if it can) between the two statements.
    let promoted = promote(&shard).await;
    pause.commit().await.unwrap();
    let claimed = claimer.await.unwrap();
    assert_eq!(
        claimed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![unkeyed]
    );
    assert_eq!(
        stranded(&shard).await,
        Vec::<String>::new(),
        "a key is left with waiting jobs only (the promotion during the claim queued {promoted})"
    );

    // The key goes on: its retrying job is promoted and runs first, then the later one.
    db.batch_execute("DROP TRIGGER pause_claim ON workflow_status")
        .await
        .unwrap();
    assert_eq!(
        promote(&shard).await,
        1,
        "the retrying job was promoted now"
    );
    let run: Vec<JobId> = claim(&shard, "w2").await.iter().map(|j| j.id).collect();
    assert_eq!(run, vec![retrying, later]);
}

/// The same race as it happens under a real worker: keyed jobs enqueued
/// while it runs, one in ten failing its first attempt (so its key is held
/// by a `scheduled` retry while later jobs of the key arrive), promotions
/// every few milliseconds while claims run. Every job ends, and no key is
/// left with only `waiting` jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_failing_keyed_jobs_strands_no_key() {
    const KEYS: usize = 100;
    const ROUNDS: usize = 30;
    let dbs = TestShards::databases(1).await;
    let config = dbs.config(
        "[worker]\nqueues = [\"q\"]\nmaintenance_interval_ms = 10\n\
         retry_backoff_min_ms = 5\nretry_backoff_max_ms = 20\n",
    );
    let set = dbs.migrated(&config).await;
    let shard = set.get(0).clone();
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let mut handlers = shardq::HandlerRegistry::with_builtins();
    handlers.register("flaky", |ctx| async move {
        if ctx.payload["fail"] == json!(true) && ctx.attempt == 1 {
            return Err("first attempt fails".into());
        }
        Ok(json!(null))
    });
    let stop = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(shardq::Worker::new(config, set.clone(), handlers).run(stop.clone()));
    for round in 0..ROUNDS {
        let batch = (0..KEYS)
            .map(|k| {
                let fail = (round * KEYS + k) % 10 == 0;
                NewJob::new("q", "flaky", json!({ "fail": fail })).ordering_key(format!("k{k}"))
            })
            .collect();
        client.enqueue_many(batch).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let finished = {
        let shard = shard.clone();
        tokio::time::timeout(Duration::from_secs(60), async move {
            loop {
                let done = common::count_on(&shard, "succeeded").await.unwrap();
                if done == (KEYS * ROUNDS) as i64 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await
    };
    let left = stranded(&shard).await;
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "keys stranded with waiting jobs only"
    );
    assert!(finished.is_ok(), "every job ended within 60 s");
}
