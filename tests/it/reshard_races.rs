//! Resharding at the exact instants a review found it broken: a
//! deduplicated job that changes state between the open's reads, a job
//! whose worker died on a shard that leaves the list, an enqueue whose reply
//! was lost before a move, `shardq check` during a move, and a copy refused
//! for its deduplication id that a cancel must let finish. Each test drives
//! the interleaving and fails without its fix.

use crate::common;

use common::{wait_until, TestShards};
use serde_json::json;
use shardq::client::CheckOptions;
use shardq::reshard::{reshard, Options, Step};
use shardq::shard_map::ShardMap;
use shardq::shards::{Shard, ShardSet};
use shardq::{Client, ClientError, Config, HandlerRegistry, JobId, NewJob, OnDuplicate, Worker};
use shardq_harness::lossy_proxy::{server_addr, LossyProxy};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const PATIENCE: Duration = Duration::from_secs(30);

/// Two shards growing to three on one server (the third migrated to join).
async fn growing_two_to_three() -> crate::reshard::GrowingToThree {
    crate::reshard::growing_to_three(TestShards::databases(3).await, "").await
}

/// Shards at these URLs, their servers owned elsewhere.
fn only(urls: &[String]) -> TestShards {
    TestShards {
        servers: Vec::new(),
        urls: urls.to_vec(),
    }
}

/// A key (`prefix-N`) whose range moves to shard 2 from shard `from`.
fn key_moving_from(plan: &shardq::reshard::Plan, prefix: &str, from: usize) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| {
            let at = shardq::router::shard_key_for(k);
            plan.moves.iter().any(|m| {
                m.first_key <= at && at < m.end_key && m.to_index == 2 && m.from_index == from
            })
        })
        .unwrap()
}

/// A key (`prefix-N`) that a map of two shards routes to `shard`.
fn key_on(shard: usize, prefix: &str) -> String {
    let map = ShardMap::from_formula(2);
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| map.shard_for(shardq::router::shard_key_for(k)) == shard)
        .unwrap()
}

/// Makes job `id` look claimed by a worker that died: running, its lease
/// expired a second ago.
async fn claimed_by_a_dead_worker(shard: &Shard, id: JobId) {
    let changed = shard
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET status = 'running', owner = 'dead-worker', \
                 attempts = attempts + 1, fence = fence + 1, started_at = now(), \
                 lease_expires_at = now() - interval '1 second' \
             WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap();
    assert_eq!(changed, 1);
}

/// Jobs with `payload` on every shard, by (shard index, id).
async fn copies_of(all: &ShardSet, payload: serde_json::Value) -> Vec<(usize, i64, String)> {
    let mut out = Vec::new();
    for shard in all.all() {
        let db = shard.client().await.unwrap();
        for row in db
            .query(
                "SELECT id, status FROM workflow_status WHERE payload = $1::text::jsonb \
                 AND NOT (status = 'held' AND held_status = 'running')",
                &[&payload.to_string()],
            )
            .await
            .unwrap()
        {
            out.push((shard.index, row.get(0), row.get(1)));
        }
    }
    out
}

/// A deduplicated job D is running when the move opens its range (so its
/// key is not among those to copy), and its dead worker's lease is
/// recovered (running → queued) while the open marks another key's jobs:
/// by the time the stand-ins are read, D is neither running nor copied.
/// It must still keep its deduplication id on the new shard, and the move
/// must finish (before the fix: D's id was admitted again on the new shard,
/// and D, refused there, kept the move from ever finishing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deduplicated_job_recovered_between_the_opens_reads_keeps_its_id() {
    let m = growing_two_to_three().await;
    let d = key_moving_from(&m.plan, "order-d", 0);
    let e = key_moving_from(&m.plan, "order-e", 0);
    let job = |dedup: &str| {
        NewJob::new("moving", "noop", json!({ "dedup": dedup }))
            .dedup(dedup.to_string(), OnDuplicate::Error)
    };
    let client = Client::new(&m.new).unwrap();
    let ids = client.enqueue_many(vec![job(&d), job(&e)]).await.unwrap();
    let old = m.all.get(0);
    claimed_by_a_dead_worker(old, ids[0]).await;

    // E's row locked: the open lists the keys (E's, not D's: D runs), then
    // its mark waits here.
    let mut blocker = old.client().await.unwrap();
    let lock = blocker.transaction().await.unwrap();
    lock.query(
        "SELECT 1 FROM workflow_status WHERE shard_key = $1 AND id = $2 FOR UPDATE",
        &[&ids[1].shard_key, &ids[1].id],
    )
    .await
    .unwrap();
    let opening = tokio::spawn({
        let all = m.all.clone();
        async move {
            let options = Options {
                stop_after: Some(Step::Opened),
                ..Options::default()
            };
            reshard(&all, 2, 3, &options, |_| {}).await
        }
    });
    let watcher = old.client().await.unwrap();
    wait_until(Duration::from_secs(30), "the open's mark waits", || {
        let watcher = &watcher;
        async move {
            let waiting: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND wait_event_type = 'Lock' AND query LIKE '%SET held_status = w.status%'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            waiting > 0
        }
    })
    .await;
    // D's worker is declared dead: its job goes back to the queue.
    let recovered = shardq::store::upkeep::recover_expired(old, 100)
        .await
        .unwrap();
    assert_eq!(recovered.requeued, 1);
    lock.commit().await.unwrap();
    opening.await.unwrap().expect("the range opens");

    match client.enqueue(job(&d)).await {
        Err(ClientError::Duplicate { .. }) => {}
        other => panic!("{d} admitted a second time while D waits on its old shard: {other:?}"),
    }
    let options = Options {
        patience: Some(PATIENCE),
        ..Options::default()
    };
    let summary = reshard(&m.all, 2, 3, &options, |_| {})
        .await
        .expect("the move finishes");
    assert!(summary.complete);
    let d_jobs = copies_of(&m.all, json!({ "dedup": d })).await;
    assert_eq!(d_jobs.len(), 1, "D once: {d_jobs:?}");
    assert_eq!(d_jobs[0].0, 2, "D on its new shard: {d_jobs:?}");
    assert_eq!(d_jobs[0].2, "queued");
}

/// Shrinking 2 → 1: a job on the leaving shard was claimed by a worker that
/// then died (SIGKILL, no completion). No worker is left to recover it: the
/// old list is refused once the epoch is recorded, and the new list does not
/// name the leaving shard. The move is responsible for its range until it
/// releases it: it recovers the lease, copies the job, finishes, and a
/// worker of the new list runs the job (before the fix: the move waited
/// for the job forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrink_recovers_a_job_whose_worker_died_on_the_leaving_shard() {
    let servers = TestShards::databases(2).await;
    let config = servers.config("");
    let all = servers.migrated(&config).await;
    let key = key_on(1, "leaving");
    let id = Client::new(&config)
        .unwrap()
        .enqueue(NewJob::new("moving", "noop", json!({ "leaving": true })).ordering_key(key))
        .await
        .unwrap();
    claimed_by_a_dead_worker(all.get(1), id).await;

    let options = Options {
        patience: Some(PATIENCE),
        ..Options::default()
    };
    let summary = reshard(&all, 2, 1, &options, |_| {})
        .await
        .expect("the move recovers the dead worker's job and finishes");
    assert!(summary.complete);
    let row = all
        .get(0)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT status, attempts FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "queued");
    assert_eq!(row.get::<_, i32>(1), 1, "the dead worker's attempt counts");

    let one = Config::from_toml(
        &only(&servers.urls[..1])
            .toml("[worker]\nqueues = [\"moving\"]\nmaintenance_interval_ms = 100\n"),
    )
    .unwrap();
    let report = Worker::new(
        one.clone(),
        ShardSet::connect(&one).unwrap(),
        HandlerRegistry::with_builtins(),
    )
    .stop_when_empty(true)
    .run(CancellationToken::new())
    .await;
    assert_eq!(report.stats.succeeded, 1);
}

/// An enqueue commits on shard 1, its reply is lost (and so are those of
/// its retries), and the caller holds the pending enqueue. A shrink 2 → 1
/// copies the job to shard 0 and removes it from shard 1. The caller's
/// `enqueue_again` is refused by shard 1 (its map moved on), finds nothing
/// there, and must find the job where the map routes it now, by content,
/// and return its id: one job, not two (before the fix: written again on
/// shard 0 under a new id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_whose_reply_was_lost_before_a_shrink_is_not_written_twice() {
    let servers = TestShards::databases(2).await;
    let direct = servers.config("");
    let all = servers.migrated(&direct).await;
    let proxy = LossyProxy::start(server_addr(&servers.urls[1]));
    let server = server_addr(&servers.urls[1]).to_string();
    let proxied = only(&[
        servers.urls[0].clone(),
        servers.urls[1].replace(&server, &proxy.addr().to_string()),
    ]);
    let client = Client::new(&proxied.config("")).unwrap();
    let payload = json!({ "reply": "lost" });
    let job = NewJob::new("moving", "noop", payload.clone()).ordering_key(key_on(1, "lost"));

    // Every reply to the insert (the first try's and the retries') is lost
    // after its commit.
    proxy.set_drop_only(Some("OVERRIDING SYSTEM VALUE"));
    proxy.set_drop_probability(1.0);
    let pending = match client.enqueue(job).await {
        Err(ClientError::OutcomeUnknown { pending, .. }) => pending,
        other => panic!("the insert's replies were lost: {other:?}"),
    };
    proxy.set_drop_probability(0.0);
    assert!(proxy.dropped() >= 1);
    let written = copies_of(&all, payload.clone()).await;
    assert_eq!(written.len(), 1, "the first try committed: {written:?}");

    let options = Options {
        patience: Some(PATIENCE),
        ..Options::default()
    };
    assert!(
        reshard(&all, 2, 1, &options, |_| {})
            .await
            .unwrap()
            .complete
    );
    let moved = copies_of(&all, payload.clone()).await;
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].0, 0, "the move took it to shard 0: {moved:?}");

    let ids = client
        .enqueue_again(*pending)
        .await
        .expect("the call settles");
    let after = copies_of(&all, payload).await;
    assert_eq!(after.len(), 1, "written once: {after:?}");
    assert_eq!(
        ids[0].id, after[0].1,
        "the id of the job the first try wrote"
    );
}

/// `shardq check` during a move judges held jobs by what a move promises:
/// a move stopped after its copy (jobs held on the new shard, the newest
/// rows there) breaks no invariant; a held job left after its range was
/// released (nothing would ever release it) does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_judges_held_jobs_by_what_a_move_promises() {
    let m = growing_two_to_three().await;
    let client = Client::new(&m.new).unwrap();
    let jobs: Vec<NewJob> = (0..60)
        .map(|i| {
            NewJob::new("moving", "noop", json!({ "i": i }))
                .ordering_key(format!("k-{i}"))
                .delay(Duration::from_secs(3_600))
        })
        .collect();
    client.enqueue_many(jobs).await.unwrap();
    let options = Options {
        stop_after: Some(Step::Copied),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &options, |_| {}).await.unwrap();
    let held = common::count_on(m.all.get(2), "held").await.unwrap();
    assert!(held > 0, "jobs wait held on the new shard");
    let check = CheckOptions::from_config(&m.new);
    let report = client.check(&check).await;
    assert_eq!(report.violations(), 0, "{report:#?}");

    let finish = Options {
        patience: Some(PATIENCE),
        ..Options::default()
    };
    assert!(
        reshard(&m.all, 2, 3, &finish, |_| {})
            .await
            .unwrap()
            .complete
    );
    // A held job on shard 2 after the release: stranded.
    m.all
        .get(2)
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET held_status = status, status = 'held' \
             WHERE id = (SELECT min(id) FROM workflow_status WHERE status = 'scheduled')",
            &[],
        )
        .await
        .unwrap();
    let report = client.check(&check).await;
    assert_eq!(report.violations(), 1, "{report:#?}");
    let finding = format!("{report:?}");
    assert!(
        finding.contains("held outside any unfinished move"),
        "{finding}"
    );
}

/// A copy refused by the new shard (another job holds its deduplication id
/// there) stays held on the old shard; the documented remedy, cancelling
/// it, must let the move finish (before the fix: a cancel left it held,
/// holding its id, and the move never finished).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_refused_copy_lets_the_move_finish() {
    let m = growing_two_to_three().await;
    let d = key_moving_from(&m.plan, "taken", 1);
    let client = Client::new(&m.new).unwrap();
    let id = client
        .enqueue(
            NewJob::new("moving", "noop", json!({ "taken": true }))
                .dedup(d.clone(), OnDuplicate::Error)
                .delay(Duration::from_secs(3_600)),
        )
        .await
        .unwrap();
    let options = |stop| Options {
        stop_after: stop,
        patience: Some(Duration::from_secs(3)),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &options(Some(Step::Recorded)), |_| {})
        .await
        .unwrap();
    // Another job under the same deduplication id on the new shard, as an
    // enqueue admitted there before the fix could leave it.
    // Written past the hold trigger (which would wait for the range to open).
    let mut db = m.all.get(2).client().await.unwrap();
    let tx = db.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL session_replication_role = replica")
        .await
        .unwrap();
    tx.execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, payload, status, \
             held_status, dedup_id, max_attempts) \
         VALUES ($1, 'moving', 'noop', '{}', 'held', 'queued', $2, 3)",
        &[&id.shard_key, &d],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let stalled = reshard(&m.all, 2, 3, &options(None), |_| {}).await;
    assert!(
        matches!(stalled, Err(shardq::reshard::ReshardError::Stalled(..))),
        "the copy is refused: {stalled:?}"
    );
    client.cancel(id).await.unwrap();
    let summary = reshard(&m.all, 2, 3, &options(None), |_| {})
        .await
        .expect("the cancelled job no longer holds the move");
    assert!(summary.complete);
    let d_jobs = copies_of(&m.all, json!({ "taken": true })).await;
    assert_eq!(d_jobs, vec![(1, id.id, "cancelled".to_string())]);
}
