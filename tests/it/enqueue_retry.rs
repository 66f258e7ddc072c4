//! An enqueue whose reply was lost is retried safely by default: each shard
//! sits behind a [`LossyProxy`] that now and then closes the connection right
//! after a statement committed, so the client cannot tell whether its insert
//! ran. The client retries on its own; every job must then exist exactly once,
//! every id it returned must be a row, and no call may report a failure for
//! jobs it wrote (README, "Guarantees").

use crate::common;

use common::TestShards;
use shardq::job::{JobId, OnDuplicate};
use shardq::{Client, ClientError, NewJob};
use shardq_harness::lossy_proxy::LossyProxy;
use std::collections::{HashMap, HashSet};

/// Jobs enqueued one call each, then in batches (spread over both shards).
const SINGLE: usize = 150;
const BATCHES: usize = 30;
const BATCH: usize = 20;
/// Every this many single jobs has a deduplication id that fails on a
/// duplicate: a retry of its own insert must not count as one.
const DEDUP_EVERY: usize = 5;
/// Chance that a reply after a commit is lost, per proxy.
const DROP_PROBABILITY: f64 = 0.15;
/// Calls again after an error that says nothing was written, or the outcome is
/// unknown; more than this many for one call fails the test (never hangs).
const CALLER_RETRIES: usize = 20;

/// The shards' URLs with each server's address replaced by its proxy's.
fn through(shards: &TestShards, proxies: &[LossyProxy]) -> TestShards {
    TestShards {
        servers: Vec::new(),
        urls: shards
            .urls
            .iter()
            .zip(proxies)
            .map(|(url, proxy)| {
                let server = shardq_harness::lossy_proxy::server_addr(url).to_string();
                assert!(url.contains(&server), "{url} names {server}");
                url.replace(&server, &proxy.addr().to_string())
            })
            .collect(),
    }
}

/// The job numbered `i` (its payload says which, so that duplicates show).
fn job(i: usize) -> NewJob {
    let job = NewJob::new("retry", "noop", serde_json::json!({ "i": i }));
    if i < SINGLE && i % DEDUP_EVERY == 0 {
        job.dedup(format!("dedup-{i}"), OnDuplicate::Error)
    } else {
        job
    }
}

/// What the caller saw: calls that failed for good, calls that said nothing
/// was written (called again), and calls whose outcome was unknown (settled
/// with `enqueue_again`).
#[derive(Default)]
struct Seen {
    failed_calls: Vec<String>,
    not_written: usize,
    unknown: usize,
}

/// One `enqueue_many` call as a careful caller makes it: a transient shard
/// error means nothing was written, so it calls again; an unknown outcome is
/// settled by `enqueue_again`. Anything else fails the call.
async fn enqueue(client: &Client, jobs: Vec<NewJob>, seen: &mut Seen) -> Vec<JobId> {
    let mut result = client.enqueue_many(jobs.clone()).await;
    for _ in 0..CALLER_RETRIES {
        result = match result {
            Ok(ids) => return ids,
            Err(ClientError::Shard(err)) if !err.is_permanent() => {
                seen.not_written += 1;
                client.enqueue_many(jobs.clone()).await
            }
            Err(ClientError::OutcomeUnknown { pending, .. }) => {
                seen.unknown += 1;
                client.enqueue_again(*pending).await
            }
            Err(err) => {
                result = Err(err);
                break;
            }
        }
    }
    if let Err(err) = result {
        seen.failed_calls.push(shardq::error_chain(&err));
    }
    Vec::new()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_whose_reply_was_lost_is_retried_without_duplicate_or_loss() {
    let shards = TestShards::databases(2).await;
    let direct = shards.config("");
    let set = shards.migrated(&direct).await;
    let proxies: Vec<LossyProxy> = shards
        .urls
        .iter()
        .map(|url| LossyProxy::start(shardq_harness::lossy_proxy::server_addr(url)))
        .collect();
    let config = through(&shards, &proxies).config("");
    let client = Client::new(&config).unwrap();
    for proxy in &proxies {
        proxy.set_drop_probability(DROP_PROBABILITY);
    }

    let mut seen = Seen::default();
    let mut returned: Vec<(usize, JobId)> = Vec::new();
    for i in 0..SINGLE {
        let ids = enqueue(&client, vec![job(i)], &mut seen).await;
        returned.extend(ids.into_iter().map(|id| (i, id)));
    }
    for b in 0..BATCHES {
        let first = SINGLE + b * BATCH;
        let ids = enqueue(
            &client,
            (first..first + BATCH).map(job).collect(),
            &mut seen,
        )
        .await;
        returned.extend((first..).zip(ids));
    }
    for proxy in &proxies {
        proxy.set_drop_probability(0.0);
    }
    let dropped: Vec<String> = proxies
        .iter()
        .flat_map(LossyProxy::dropped_statements)
        .collect();
    let inserts_dropped = dropped
        .iter()
        // The inserts (fenced by the map's epoch: `WITH fence ... INSERT`).
        .filter(|s| s.contains("INSERT INTO workflow_status"))
        .count();
    eprintln!(
        "{} replies dropped, {inserts_dropped} of inserts; {} failed calls, {} said nothing \
         was written, {} left the outcome unknown",
        dropped.len(),
        seen.failed_calls.len(),
        seen.not_written,
        seen.unknown
    );
    // The fault happened where it matters.
    assert!(inserts_dropped > 0, "no insert lost its reply: {dropped:?}");

    // Every job exactly once, read on direct connections.
    let total = SINGLE + BATCHES * BATCH;
    let mut rows: HashMap<JobId, usize> = HashMap::new();
    let mut numbers: HashMap<usize, usize> = HashMap::new();
    for shard in set.all() {
        for row in shard
            .client()
            .await
            .unwrap()
            .query(
                "SELECT shard_key, id, (payload->>'i')::int FROM workflow_status",
                &[],
            )
            .await
            .unwrap()
        {
            let id = JobId {
                shard_key: row.get(0),
                id: row.get(1),
            };
            let i = row.get::<_, i32>(2) as usize;
            rows.insert(id, i);
            *numbers.entry(i).or_default() += 1;
        }
    }
    let doubled: Vec<_> = numbers.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "jobs written twice: {doubled:?}");
    assert!(
        seen.failed_calls.is_empty(),
        "{} calls reported a failure (their jobs: {} of {total} rows exist): {:?}",
        seen.failed_calls.len(),
        rows.len(),
        seen.failed_calls
    );
    assert_eq!(rows.len(), total, "one row per job");
    let mut distinct = HashSet::new();
    for (i, id) in &returned {
        assert_eq!(rows.get(id), Some(i), "returned id {id} is job {i}'s row");
        assert!(distinct.insert(*id), "id {id} returned twice");
    }
    assert_eq!(returned.len(), total, "an id for every job");
}

/// Jobs in the call whose every reply is lost.
const UNCONFIRMED_JOBS: usize = 40;

/// The exact point: the ids are taken, the insert is held back by a table
/// lock, and from then on every reply is lost, so the insert and each retry
/// commit (the retries writing nothing) and the client hears of none. The
/// call must say its outcome is unknown, and `enqueue_again` must return
/// every id with each job written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_committed_but_never_confirmed_is_settled_by_enqueue_again() {
    let shards = TestShards::databases(1).await;
    let direct = shards.config("");
    let set = shards.migrated(&direct).await;
    let proxies = vec![LossyProxy::start(shardq_harness::lossy_proxy::server_addr(
        &shards.urls[0],
    ))];
    // The held insert waits for the lock, not for a timeout.
    let config = through(&shards, &proxies).config("[dequeue]\nlock_timeout_ms = 30000\n");
    let client = Client::new(&config).unwrap();

    let mut holder = set.get(0).client().await.unwrap();
    let tx = holder.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE workflow_status IN SHARE MODE")
        .await
        .unwrap();
    let jobs: Vec<NewJob> = (0..UNCONFIRMED_JOBS).map(job_without_dedup).collect();
    let call = {
        let client = client.clone();
        tokio::spawn(async move { client.enqueue_many(jobs).await })
    };
    // The ids are taken when the table's sequence has moved.
    common::wait_until(
        std::time::Duration::from_secs(30),
        "the enqueue took its ids",
        || async {
            let db = set.get(0).client().await.unwrap();
            let row = db
                .query_one("SELECT is_called FROM workflow_status_id_seq", &[])
                .await
                .unwrap();
            row.get::<_, bool>(0)
        },
    )
    .await;
    proxies[0].set_drop_probability(1.0);
    tx.commit().await.unwrap();
    let err = call.await.unwrap().expect_err("no reply came back");
    let pending = match err {
        ClientError::OutcomeUnknown { pending, source } => {
            eprintln!(
                "outcome unknown, as it should be: {}",
                shardq::error_chain(&source)
            );
            pending
        }
        other => panic!(
            "expected an unknown outcome, got {}",
            shardq::error_chain(&other)
        ),
    };
    assert!(
        proxies[0].dropped() >= 2,
        "the insert and its retries lost their replies"
    );
    proxies[0].set_drop_probability(0.0);
    assert_eq!(pending.len(), UNCONFIRMED_JOBS);
    let ids = client.enqueue_again(*pending.clone()).await.unwrap();
    // Settling twice is as safe as once.
    let again = client.enqueue_again(*pending).await.unwrap();
    assert_eq!(ids, again, "the same ids every time");

    let db = set.get(0).client().await.unwrap();
    let rows: Vec<(JobId, i32)> = db
        .query(
            "SELECT shard_key, id, (payload->>'i')::int FROM workflow_status ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                JobId {
                    shard_key: r.get(0),
                    id: r.get(1),
                },
                r.get(2),
            )
        })
        .collect();
    assert_eq!(rows.len(), UNCONFIRMED_JOBS, "each job written once");
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            rows[i],
            (*id, i as i32),
            "job {i}: its id, ascending in input order"
        );
    }
}

/// The job numbered `i`, never with a deduplication id.
fn job_without_dedup(i: usize) -> NewJob {
    NewJob::new("retry", "noop", serde_json::json!({ "i": i }))
}
