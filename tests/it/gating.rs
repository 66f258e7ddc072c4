//! Gating bound: with K = 2 dequeue slots, at most two claims run at once on a
//! shard, however many claimers try; without gating, more do. And the
//! producers of one worker process share the slots before the database: many
//! producers in one process never collect a busy answer from it.

use crate::common;

use common::TestShards;
use shardq::config::DequeueMode;
use shardq::shards::ShardSet;
use shardq::store::jobs::{self, ClaimParams};
use shardq::worker::HandlerRegistry;
use shardq::{Client, NewJob, Worker};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const CLAIMERS: usize = 32;

/// Makes every claimed row cost 2 ms inside the claim statement, so claims
/// overlap measurably.
const SLOW_CLAIM_TRIGGER: &str = "
    CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.status = 'running' THEN PERFORM pg_sleep(0.002); END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER slow_claim BEFORE UPDATE ON workflow_status
        FOR EACH ROW EXECUTE FUNCTION slow_claim();";

/// Claims that got past the gate and are writing: only a transaction that
/// updates rows takes a transaction id, and holds the lock on it until commit.
/// A busy claimer writes nothing. `pg_locks` is read as one consistent snapshot.
const CLAIMS_IN_FLIGHT: &str = "SELECT count(*) FROM pg_locks \
    WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' AND granted";

/// The migrated shard of `shards` with slow claims and `jobs` noop jobs in `queue`.
async fn slow_shard_with_jobs(
    shards: &TestShards,
    config: &shardq::Config,
    queue: &str,
    jobs: usize,
) -> ShardSet {
    let set = shards.migrated(config).await;
    set.get(0)
        .client()
        .await
        .unwrap()
        .batch_execute(SLOW_CLAIM_TRIGGER)
        .await
        .unwrap();
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let jobs = (0..jobs)
        .map(|_| NewJob::new(queue, "noop", serde_json::json!({})))
        .collect();
    client.enqueue_many(jobs).await.unwrap();
    set
}

async fn max_concurrent_claims(mode: DequeueMode) -> i64 {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = slow_shard_with_jobs(&shards, &config, "q", 20_000).await;
    let shard = set.get(0).clone();

    let stop = Arc::new(AtomicBool::new(false));
    // Own pool so claimers never wait for a connection behind each other.
    let claim_set = ShardSet::connect(&shards.config("")).unwrap();
    let mut tasks = Vec::new();
    for i in 0..CLAIMERS {
        let (shard, stop) = (claim_set.get(0).clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let owner = format!("claimer-{i}");
            while !stop.load(Ordering::Relaxed) {
                let params = ClaimParams {
                    queue: "q",
                    limit: 5,
                    owner: &owner,
                    lease: Duration::from_secs(60),
                    mode,
                };
                jobs::claim(&shard, params).await.unwrap();
            }
        }));
    }
    let sampler = shard.client().await.unwrap();
    let mut max_seen = 0;
    for _ in 0..400 {
        let n: i64 = sampler
            .query_one(CLAIMS_IN_FLIGHT, &[])
            .await
            .unwrap()
            .get(0);
        max_seen = max_seen.max(n);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    max_seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_claims_never_exceed_the_slots_and_ungated_do() {
    let gated = max_concurrent_claims(DequeueMode::Gated { slots: 2 }).await;
    assert!(
        gated >= 1,
        "the sampler must see claims at all (saw {gated})"
    );
    assert!(gated <= 2, "K = 2 but {gated} claims ran at once");
    let ungated = max_concurrent_claims(DequeueMode::Ungated).await;
    eprintln!("most claims at once: gated {gated}, ungated {ungated}");
    assert!(
        ungated > 2,
        "without gating more than 2 claims should overlap, saw {ungated}"
    );
}

/// One worker with 32 producers, K = 2, alone on a shard whose claims are slow:
/// the process lets at most K of its producers claim at once, so the database
/// never answers it busy. Without the per-process gate most of the 32
/// concurrent attempts would come back busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_of_one_process_never_miss_a_slot_on_their_own() {
    let shards = TestShards::databases(1).await;
    let config = shards.config(
        "[dequeue]\nmode = \"gated\"\nslots_per_shard = 2\nbatch_size = 20\n\
         [worker]\nproducers = 32\nbuffer_jobs = 2000\n",
    );
    let set = slow_shard_with_jobs(&shards, &config, "default", 3_000).await;

    let worker =
        Worker::new(config, set.clone(), HandlerRegistry::with_builtins()).stop_when_empty(true);
    let stats = worker.stats();
    worker.run(CancellationToken::new()).await;
    let s = stats.snapshot();
    assert_eq!(s.succeeded, 3_000, "every job runs");
    assert!(s.claim_statements >= 100, "claims: {}", s.claim_statements);
    assert_eq!(
        s.busy, 0,
        "the process's own producers collided in the database"
    );
}
