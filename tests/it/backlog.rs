//! `store::backlog::read`, what the metrics exporter runs per scrape: the
//! counts by state, the oldest ready job's age, and a plan that reads only
//! the partial indexes of unfinished jobs however much history there is.

use crate::common;

use common::TestShards;
use serde_json::Value;
use shardq::store::backlog::{self, QueueBacklog};
use shardq::store::sql;
use shardq::{Client, NewJob};
use std::time::Duration;
use tokio_postgres::types::Type;

fn find<'a>(rows: &'a [QueueBacklog], queue: &str) -> Option<&'a QueueBacklog> {
    rows.iter().find(|r| r.queue == queue)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_counts_each_state_and_ages_the_first_enqueued_ready_job() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    // The first-enqueued ready jobs are keyed and of a later priority: the
    // head is found across both ready indexes and every priority.
    let first: Vec<NewJob> = (0..2)
        .map(|i| {
            NewJob::new("x", "noop", serde_json::json!({}))
                .ordering_key(format!("k{i}"))
                .priority(5)
        })
        .collect();
    client.enqueue_many(first).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let later: Vec<NewJob> = (0..3)
        .map(|_| NewJob::new("x", "noop", serde_json::json!({})))
        .chain([NewJob::new("x", "noop", serde_json::json!({})).delay(Duration::from_secs(600))])
        .chain([NewJob::new("y", "noop", serde_json::json!({}))])
        .chain([NewJob::new("z", "noop", serde_json::json!({})).delay(Duration::from_secs(600))])
        .collect();
    client.enqueue_many(later).await.unwrap();

    let rows = backlog::read(set.get(0), None).await.unwrap();
    let x = find(&rows, "x").expect("x has unfinished jobs");
    assert_eq!(x.depth.queued, 5);
    let age = x.oldest_ready_s.unwrap();
    assert!(
        (1.1..600.0).contains(&age),
        "the oldest ready job of x waited since the first enqueue: {age} s"
    );
    let y = find(&rows, "y").unwrap();
    assert_eq!(y.depth.queued, 1);
    assert!(y.oldest_ready_s.unwrap() < age);
    assert_eq!(x.depth.delayed, 1);
    assert_eq!(x.depth.running, 0);
    // A queue with nothing ready has no ready age.
    let z = find(&rows, "z").unwrap();
    assert_eq!((z.depth.queued, z.depth.delayed), (0, 1));
    assert!(z.oldest_ready_s.is_none());
    // One queue's read is that queue's part of the whole.
    let only_x = backlog::read(set.get(0), Some("x")).await.unwrap();
    assert_eq!(only_x.len(), 1, "{only_x:?}");
    assert_eq!((only_x[0].queue.as_str(), only_x[0].depth), ("x", x.depth));
    assert!(only_x[0].oldest_ready_s.unwrap() >= age);
}

/// Finished rows in the table (by `generate_series`, as a long history).
const HISTORY: i64 = 50_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_reads_only_the_partial_indexes_of_unfinished_jobs() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let jobs = (0..200)
        .map(|i| NewJob::new(format!("q{}", i % 3), "noop", serde_json::json!({})))
        .collect();
    client.enqueue_many(jobs).await.unwrap();
    // A connection of shardq's own pool: it carries the planner settings.
    let db = set.get(0).client().await.unwrap();
    db.execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, status, finished_at) \
         SELECT (g % 65536)::int, 'q' || (g % 3), 'noop', 'succeeded', now() \
         FROM generate_series(1, $1::bigint) AS g",
        &[&HISTORY],
    )
    .await
    .unwrap();
    db.batch_execute("VACUUM ANALYZE workflow_status")
        .await
        .unwrap();

    // Every queue, and one queue (what `Client::depth` reads).
    for queue in [None, Some("q1")] {
        reads_only_unfinished(&db, queue).await;
    }
    let rows = backlog::read(set.get(0), None).await.unwrap();
    let ready: i64 = rows.iter().map(|r| r.depth.queued).sum();
    assert_eq!(ready, 200);
}

/// Checks the plan of the backlog read for `queue` (all when `None`).
async fn reads_only_unfinished(db: &tokio_postgres::Client, queue: Option<&str>) {
    let explain = format!("EXPLAIN (ANALYZE, FORMAT JSON) {}", sql::QUEUE_BACKLOG);
    let plan: Value = db
        .query_typed_one(explain.as_str(), &[(&queue, Type::TEXT)])
        .await
        .unwrap()
        .get(0);
    let text = plan.to_string();
    let mut scans = Vec::new();
    table_scans(&plan, &mut scans);
    assert!(!scans.is_empty(), "no read of workflow_status in {text}");
    let unfinished = [
        "workflow_status_ready_plain",
        "workflow_status_ready_keyed",
        "workflow_status_ready_grouped",
        "workflow_status_group_lines",
        "workflow_status_pkey",
        "workflow_status_key",
        "workflow_status_scheduled_by_kind",
        "workflow_status_lease",
    ];
    let mut rows_read = 0.0;
    for scan in &scans {
        let index = scan["Index Name"]
            .as_str()
            .unwrap_or("no index (a table scan)");
        assert!(
            unfinished.contains(&index),
            "the backlog reads {index}, which holds finished rows: {text}"
        );
        let loops = scan["Actual Loops"].as_f64().unwrap_or(1.0);
        rows_read += scan["Actual Rows"].as_f64().unwrap_or(0.0) * loops;
    }
    assert!(
        rows_read < 1_000.0,
        "{rows_read} rows read for 200 unfinished jobs ({queue:?}): {text}"
    );
}

/// Every plan node that reads `workflow_status`.
fn table_scans<'a>(node: &'a Value, out: &mut Vec<&'a Value>) {
    match node {
        Value::Object(map) => {
            if map.get("Relation Name").and_then(Value::as_str) == Some("workflow_status") {
                out.push(node);
            }
            map.values().for_each(|v| table_scans(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| table_scans(v, out)),
        _ => {}
    }
}

/// `Client::depth` sums one queue over the shards and follows what was
/// enqueued, claimed and completed; a shard that does not answer is reported
/// with its error and left out of the counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_depth_follows_enqueues_claims_and_completions_on_two_shards() {
    use shardq::config::{Backoff, DequeueMode};
    use shardq::job::{Completion, Outcome};
    use shardq::store::jobs::{self, Claim, ClaimParams, CompleteMany};
    use shardq_local::StopMode;

    const READY: i64 = 30;
    const DELAYED: i64 = 4;
    let shards = TestShards::servers(2).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let jobs = (0..READY)
        .map(|i| NewJob::new("d", "noop", serde_json::json!({ "i": i })))
        .chain((0..DELAYED).map(|_| {
            NewJob::new("d", "noop", serde_json::json!({})).delay(Duration::from_secs(600))
        }))
        // Another queue's jobs are not counted.
        .chain((0..5).map(|_| NewJob::new("other", "noop", serde_json::json!({}))))
        .collect();
    client.enqueue_many(jobs).await.unwrap();

    let depth = client.depth("d").await.unwrap();
    assert!(depth.complete(), "{:?}", depth.failed);
    assert_eq!(depth.answered.len(), 2);
    assert_eq!(
        (
            depth.counts.queued,
            depth.counts.delayed,
            depth.counts.total()
        ),
        (READY, DELAYED, READY + DELAYED)
    );

    // Claim up to 4 on each shard, then complete half of what each took as
    // succeeded and the rest as failed (attempts left: retrying).
    let mut claimed = 0;
    let mut succeeded = 0;
    let mut failed = 0;
    for shard in set.all() {
        let params = ClaimParams {
            queue: "d",
            limit: 4,
            owner: "w",
            lease: Duration::from_secs(60),
            mode: DequeueMode::Ungated,
        };
        let Claim::Jobs(taken) = jobs::claim(shard, params).await.unwrap() else {
            panic!("shard {} has no ready job of d", shard.name)
        };
        claimed += taken.len() as i64;
        let now = std::time::Instant::now();
        let done: Vec<Completion> = taken
            .iter()
            .enumerate()
            .map(|(i, j)| Completion {
                id: j.id,
                shard: j.shard,
                fence: j.fence,
                key: None,
                outcome: if i % 2 == 0 {
                    Outcome::Succeeded(serde_json::json!({}))
                } else {
                    Outcome::Failed("no".into())
                },
                finished: now,
                credited: true,
            })
            .collect();
        let during = client.depth("d").await.unwrap();
        assert!(during.counts.running >= taken.len() as i64);
        let written = jobs::complete_many(
            shard,
            CompleteMany {
                owner: "w",
                retry: Backoff {
                    min: Duration::from_secs(60),
                    max: Duration::from_secs(120),
                },
                done: &done,
            },
        )
        .await
        .unwrap();
        succeeded += written.succeeded as i64;
        failed += written.retrying as i64;
    }
    assert_eq!(succeeded + failed, claimed);
    let depth = client.depth("d").await.unwrap();
    assert_eq!(
        depth.counts,
        shardq::client::StateCounts {
            queued: READY - claimed,
            waiting: 0,
            retrying: failed,
            delayed: DELAYED,
            parked: 0,
            running: 0,
        }
    );

    // Shard 1 stops: its error is reported, shard 0's jobs still counted.
    let on_shard_0: i64 = set
        .get(0)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT count(*) FROM workflow_status WHERE queue = 'd' AND status = 'queued'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    shards.servers[1].stop(StopMode::Fast).unwrap();
    let depth = client.depth("d").await.unwrap();
    assert_eq!(depth.answered, vec![set.get(0).name.clone()]);
    assert_eq!(depth.failed.len(), 1, "{:?}", depth.failed);
    assert_eq!(depth.failed[0].0, set.get(1).name);
    assert!(!depth.complete());
    assert_eq!(depth.counts.queued, on_shard_0);
}

/// The ready indexes without groups (by number, and by id).
const READY_INDEXES: [&str; 4] = [
    "workflow_status_ready_plain",
    "workflow_status_dequeue_plain",
    "workflow_status_ready_keyed",
    "workflow_status_dequeue_keyed",
];

/// Index entries of [`READY_INDEXES`] this backend has read and not yet
/// reported (a reading is a difference).
async fn ready_entries(tx: &tokio_postgres::Transaction<'_>) -> i64 {
    common::xact_stat(tx, "tuples_returned", &READY_INDEXES).await
}

/// `statement` (a backlog read: $1 the queue, every queue when `None`) in
/// a transaction of its own, rolled back: its rows, and the entries of
/// `indexes` it met.
pub(crate) async fn read_meeting(
    db: &mut tokio_postgres::Client,
    statement: &str,
    queue: Option<&str>,
    indexes: &[&str],
) -> (Vec<tokio_postgres::Row>, i64) {
    let tx = db.transaction().await.unwrap();
    let before = common::xact_stat(&tx, "tuples_returned", indexes).await;
    let rows = tx.query(statement, &[&queue]).await.unwrap();
    let met = common::xact_stat(&tx, "tuples_returned", indexes).await - before;
    tx.rollback().await.unwrap();
    (rows, met)
}

/// The backlog read of `queue` (every queue when `None`): each queue's
/// ready count, and the entries of the ready indexes without groups it
/// read.
async fn ready_counts_and_entries_read(
    db: &mut tokio_postgres::Client,
    queue: Option<&str>,
) -> (std::collections::BTreeMap<String, i64>, i64) {
    let (rows, read) = read_meeting(db, sql::QUEUE_BACKLOG, queue, &READY_INDEXES).await;
    let ready = rows
        .iter()
        .filter(|r| r.get::<_, &str>("state") == "queued")
        .map(|r| (r.get::<_, String>("queue"), r.get::<_, i64>("count")))
        .collect();
    (ready, read)
}

/// While a long transaction holds the horizon, the ready versions of every
/// job claimed since stay in the ready indexes: the backlog counts the
/// ready jobs, plain and keyed, from their floors (each kind its own), as
/// the claims find them, so it reads about what is ready, not the 3,000
/// dead entries of each queue that a count from the start of the index
/// reads (what it did before, with every scrape).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_held_snapshot_the_backlog_counts_ready_jobs_from_their_floors() {
    let (shards, set) = crate::ready_floors::shard().await;
    let mut object = set.get(0).client().await.unwrap();
    let db: &mut tokio_postgres::Client = &mut object;
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    let enqueue = "INSERT INTO workflow_status (shard_key, queue, handler) \
        SELECT g % 65536, 'q', 'noop' FROM generate_series(1, $1::bigint) g";
    // Keyed jobs of their own queue, one per key (all ready at once).
    let enqueue_keyed = "INSERT INTO workflow_status (shard_key, queue, handler, ordering_key) \
        SELECT g % 65536, 'kq', 'noop', $2 || g FROM generate_series(1, $1::bigint) g";
    db.execute(enqueue, &[&3_000i64]).await.unwrap();
    db.execute(enqueue_keyed, &[&3_000i64, &"a"]).await.unwrap();
    for _ in 0..30 {
        assert_eq!(crate::ready_floors::claim(db, "q", 100).await.len(), 100);
        assert_eq!(crate::ready_floors::claim(db, "kq", 100).await.len(), 100);
    }
    crate::ready_floors::let_floors_move(db).await;
    db.execute(enqueue, &[&100i64]).await.unwrap();
    db.execute(enqueue_keyed, &[&100i64, &"b"]).await.unwrap();

    for queue in [None, Some("q"), Some("kq")] {
        let (ready, read) = ready_counts_and_entries_read(db, queue).await;
        let count = |name: &str| ready.get(name).copied().unwrap_or(0);
        let (plain, keyed) = (count("q"), count("kq"));
        match queue {
            None => assert_eq!((plain, keyed), (100, 100)),
            Some("q") => assert_eq!((plain, keyed), (100, 0)),
            _ => assert_eq!((plain, keyed), (0, 100)),
        }
        // Each ready job's entry is read (counted, and the heads found
        // again): never the 3,000 dead ones behind each floor.
        let ready_now = plain + keyed;
        assert!(
            (ready_now..=3 * ready_now).contains(&read),
            "the backlog read {read} entries of the ready indexes for {ready_now} ready jobs ({queue:?})"
        );
    }
    let tx = db.transaction().await.unwrap();
    let before = ready_entries(&tx).await;
    let counted: i64 = tx
        .query_one(
            "SELECT count(*) FROM workflow_status WHERE queue = 'q' AND status = 'queued' \
             AND ordering_key IS NULL AND job_group IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let read = ready_entries(&tx).await - before;
    tx.rollback().await.unwrap();
    assert_eq!(counted, 100);
    assert!(
        read >= 3_000,
        "the snapshot held the claimed jobs' versions: a count from the start read {read}"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// Plain and keyed jobs of one queue are counted each from its own floor:
/// the plain floor moved past 3,000 claimed plain jobs while the keyed
/// floor is still at 0 (a floor is a lower bound: where a new level's
/// starts). Read from the keyed floor, the plain count would walk all of
/// their dead entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_plain_and_keyed_jobs_are_counted_each_from_its_own_floor() {
    let (shards, set) = crate::ready_floors::shard().await;
    let mut object = set.get(0).client().await.unwrap();
    let db: &mut tokio_postgres::Client = &mut object;
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    let plain = "INSERT INTO workflow_status (shard_key, queue, handler) \
        SELECT g % 65536, 'm', 'noop' FROM generate_series(1, $1::bigint) g";
    db.execute(plain, &[&3_000i64]).await.unwrap();
    for _ in 0..30 {
        assert_eq!(crate::ready_floors::claim(db, "m", 100).await.len(), 100);
    }
    crate::ready_floors::let_floors_move(db).await;
    let floor: i64 = db
        .query_one(
            "UPDATE shardq_ready_floor_moves SET keyed_floor_seq = 0 \
             WHERE queue = 'm' AND priority = 0 RETURNING floor_seq",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(floor > 3_000, "the plain floor moved: {floor}");
    db.execute(plain, &[&100i64]).await.unwrap();
    db.execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, ordering_key) \
         VALUES (1, 'm', 'noop', 'k')",
        &[],
    )
    .await
    .unwrap();

    let (ready, read) = ready_counts_and_entries_read(db, Some("m")).await;
    assert_eq!(ready.values().sum::<i64>(), 101);
    assert!(
        (101..=303).contains(&read),
        "the backlog read {read} entries of the ready indexes for 101 ready jobs"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}
