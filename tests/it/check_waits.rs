//! `Client::check` for workflows that wait: each broken state built by
//! hand (real workflows parked by a real worker, then one write by SQL on
//! the shard) is reported, exactly it, with the workflow that shows it;
//! what the checks leave out on purpose (a grace, retention, an abandoned
//! child) is not; a healthy run of sleeping, messaging and child
//! workflows reports nothing; and each statement walks an index that its
//! `LIMIT` stops.

use crate::common;

use common::TestShards;
use serde_json::json;
use shardq::client::{CheckOptions, CheckReport, Invariant};
use shardq::{ChildPolicy, ChildResult, HandlerRegistry, JobId, NewJob, Shardq};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "flow";
/// A queue no worker of these tests serves: its jobs stay unfinished.
const IDLE: &str = "idle";

async fn shardq() -> (TestShards, Shardq) {
    let shards = TestShards::databases(1).await;
    let config = shards.config(&format!(
        "[worker]\nqueues = [\"{QUEUE}\"]\nconcurrency = 16\nmaintenance_interval_ms = 100\n\
         [dequeue]\nempty_backoff_min_ms = 5\nempty_backoff_max_ms = 20\n"
    ));
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    (shards, shardq)
}

/// Workflows that wait: `waiter` in a recv of topic `go`; `parent`
/// starts one child in the idle queue per payload entry of `children`
/// (`"abandon"` or `"cancel"`) and waits for the first; `gatherer` starts
/// three children in the served queue and sums their results; `sleeper`
/// sleeps 100 ms.
fn handlers() -> HandlerRegistry {
    let mut h = HandlerRegistry::new();
    h.register("waiter", |ctx| async move {
        Ok(json!(ctx.recv("go", Duration::from_secs(3600)).await?))
    });
    h.register("parent", |ctx| async move {
        let mut handles = Vec::new();
        for policy in ctx.payload["children"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let child =
                NewJob::new(IDLE, "child", json!({})).on_parent_cancel(if policy == "abandon" {
                    ChildPolicy::Abandon
                } else {
                    ChildPolicy::Cancel
                });
            handles.push(ctx.start_child(child).await?);
        }
        let first = handles[0].result().await?;
        Ok(json!(format!("{first:?}")))
    });
    h.register("gatherer", |ctx| async move {
        let mut handles = Vec::new();
        for n in 0..3 {
            let child = NewJob::new(QUEUE, "times_ten", json!({ "n": n }));
            handles.push(ctx.start_child(child).await?);
        }
        let mut sum = 0;
        for handle in &handles {
            if let ChildResult::Succeeded(v) = handle.result().await? {
                sum += v.as_i64().unwrap_or(0);
            }
        }
        Ok(json!(sum))
    });
    h.register("times_ten", |ctx| async move {
        Ok(json!(ctx.payload["n"].as_i64().unwrap_or(0) * 10))
    });
    h.register("sleeper", |ctx| async move {
        ctx.sleep(Duration::from_millis(100)).await?;
        Ok(json!("rested"))
    });
    h
}

async fn sql(shardq: &Shardq, statement: &str, id: JobId) -> u64 {
    shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .execute(statement, &[&id.shard_key, &id.id])
        .await
        .unwrap()
}

/// Runs a worker until every one of `ids` is parked (`scheduled`,
/// `parked`), then stops it: nothing heals what a test breaks next.
async fn park(shardq: &Shardq, ids: &[JobId]) {
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers()).run(stop.clone()));
    let db = shardq.shards().get(0).client().await.unwrap();
    let started = Instant::now();
    loop {
        let mut parked = 0;
        for id in ids {
            let row = db
                .query_one(
                    "SELECT status = 'scheduled' AND parked FROM workflow_status \
                     WHERE shard_key = $1 AND id = $2",
                    &[&id.shard_key, &id.id],
                )
                .await
                .unwrap();
            parked += usize::from(row.get::<_, bool>(0));
        }
        if parked == ids.len() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "never parked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    worker.await.unwrap();
}

/// The first child of `parent`.
async fn first_child(shardq: &Shardq, parent: JobId) -> JobId {
    let row = shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT shard_key, id FROM workflow_status \
             WHERE parent_shard_key = $1 AND parent_id = $2 ORDER BY id LIMIT 1",
            &[&parent.shard_key, &parent.id],
        )
        .await
        .unwrap();
    JobId {
        shard_key: row.get(0),
        id: row.get(1),
    }
}

async fn check(shardq: &Shardq, options: CheckOptions) -> CheckReport {
    shardq.client().check(&options).await
}

fn options(shardq: &Shardq) -> CheckOptions {
    CheckOptions::from_config(shardq.config())
}

/// The report holds exactly `expected`, `count` times, on its one shard;
/// the examples' jobs and details.
fn only(report: &CheckReport, expected: Invariant, count: u64) -> Vec<(Option<JobId>, String)> {
    assert!(report.unanswered().is_empty(), "{report:#?}");
    assert_eq!(report.broken_invariants(), vec![expected], "{report:#?}");
    assert_eq!(report.violations(), count, "{report:#?}");
    let finding = report.shards[0].finding(expected).unwrap();
    finding
        .examples
        .iter()
        .map(|e| (e.job, e.detail.clone()))
        .collect()
}

/// A workflow parked in a recv of `go` with a message of that topic in its
/// mailbox that no send woke it for (written by hand: what a send that
/// skipped its wake leaves): reported, naming the workflow and topic. A
/// message of another topic, and a parked workflow with none, are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_did_not_wake_its_parked_recv_is_reported() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let waiters = client
        .enqueue_many(vec![
            NewJob::new(QUEUE, "waiter", json!({})),
            NewJob::new(QUEUE, "waiter", json!({})),
        ])
        .await
        .unwrap();
    park(&shardq, &waiters).await;
    assert_eq!(check(&shardq, options(&shardq)).await.violations(), 0);
    let insert = |topic: &str| {
        format!(
            "INSERT INTO workflow_messages (shard_key, workflow_id, topic, message) \
             VALUES ($1, $2, '{topic}', '\"lost\"')"
        )
    };
    assert_eq!(sql(&shardq, &insert("other"), waiters[1]).await, 1);
    assert_eq!(check(&shardq, options(&shardq)).await.violations(), 0);
    assert_eq!(sql(&shardq, &insert("go"), waiters[0]).await, 1);

    let report = check(&shardq, options(&shardq)).await;
    let examples = only(&report, Invariant::LostMessageWake, 1);
    assert_eq!(examples[0].0, Some(waiters[0]), "{examples:?}");
    assert!(examples[0].1.contains("topic go"), "{examples:?}");
    assert!(examples[0].1.contains("1 unreceived"), "{examples:?}");

    // A real send of the same topic wakes the other one: still one.
    client.send(waiters[1], "go", json!(1), None).await.unwrap();
    let report = check(&shardq, options(&shardq)).await;
    only(&report, Invariant::LostMessageWake, 1);
}

/// A parent parked on a child that finished two minutes ago, its wake
/// left to the promotion (the parent's row was locked when the child
/// finished: `parent_wake`) and never settled; then the flag gone too (a
/// lost wake). Both reported past the grace, naming the parent and the
/// child; within a longer grace, not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_not_woken_by_its_finished_child_is_reported() {
    let (_shards, shardq) = shardq().await;
    let parent = shardq
        .client()
        .enqueue(NewJob::new(
            QUEUE,
            "parent",
            json!({ "children": ["cancel"] }),
        ))
        .await
        .unwrap();
    park(&shardq, &[parent]).await;
    let child = first_child(&shardq, parent).await;

    // The child ends while another transaction holds its parent's row: the
    // trigger's try of the parent's lock fails and it flags the child.
    let mut holder = shardq.shards().get(0).client().await.unwrap();
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM workflow_status WHERE shard_key = $1 AND id = $2 FOR UPDATE",
        &[&parent.shard_key, &parent.id],
    )
    .await
    .unwrap();
    let finish = "UPDATE workflow_status SET status = 'succeeded', \
        finished_at = now() - interval '2 minutes' WHERE shard_key = $1 AND id = $2";
    assert_eq!(sql(&shardq, finish, child).await, 1);
    tx.rollback().await.unwrap();
    let flagged = shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT parent_wake FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&child.shard_key, &child.id],
        )
        .await
        .unwrap()
        .get::<_, Option<bool>>(0);
    assert_eq!(flagged, Some(true), "the wake was left to the promotion");

    let report = check(&shardq, options(&shardq)).await;
    let examples = only(&report, Invariant::LostChildWake, 1);
    assert_eq!(examples[0].0, Some(parent));
    assert!(examples[0].1.contains(&child.to_string()), "{examples:?}");
    assert!(
        examples[0].1.contains("left to the promotion"),
        "{examples:?}"
    );

    let unflag = "UPDATE workflow_status SET parent_wake = NULL WHERE shard_key = $1 AND id = $2";
    assert_eq!(sql(&shardq, unflag, child).await, 1);
    let report = check(&shardq, options(&shardq)).await;
    let examples = only(&report, Invariant::LostChildWake, 1);
    assert!(examples[0].1.contains("wake was lost"), "{examples:?}");

    let patient = CheckOptions {
        child_grace: Duration::from_secs(600),
        ..options(&shardq)
    };
    assert_eq!(check(&shardq, patient).await.violations(), 0);
}

/// An unfinished child whose parent's row is gone from the shard:
/// reported, naming the child and its parent. A child created longer ago
/// than the retention of finished jobs is not judged (retention may have
/// removed a parent that finished).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_parent_is_gone_is_reported() {
    let (_shards, shardq) = shardq().await;
    let parent = shardq
        .client()
        .enqueue(NewJob::new(
            QUEUE,
            "parent",
            json!({ "children": ["cancel"] }),
        ))
        .await
        .unwrap();
    park(&shardq, &[parent]).await;
    let child = first_child(&shardq, parent).await;
    assert_eq!(check(&shardq, options(&shardq)).await.violations(), 0);
    let delete = "DELETE FROM workflow_status WHERE shard_key = $1 AND id = $2";
    assert_eq!(sql(&shardq, delete, parent).await, 1);

    let report = check(&shardq, options(&shardq)).await;
    let examples = only(&report, Invariant::ParentMissing, 1);
    assert_eq!(examples[0].0, Some(child));
    assert!(examples[0].1.contains(&parent.to_string()), "{examples:?}");

    let short_retention = CheckOptions {
        retention: Duration::from_millis(1),
        ..options(&shardq)
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(check(&shardq, short_retention).await.violations(), 0);
}

/// A cancelled workflow whose cancel reached none of its children (the
/// parent's row cancelled as `Client::cancel` cancels it, then the client
/// gone before its cascade): the child to cancel is reported past the
/// grace, the one started with `ChildPolicy::Abandon` is not; a cancel run
/// again finishes the cascade and the report is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_workflow_with_children_left_is_reported() {
    let (_shards, shardq) = shardq().await;
    let parent = shardq
        .client()
        .enqueue(NewJob::new(
            QUEUE,
            "parent",
            json!({ "children": ["cancel", "abandon"] }),
        ))
        .await
        .unwrap();
    park(&shardq, &[parent]).await;
    let child = first_child(&shardq, parent).await;
    let cancel = "UPDATE workflow_status SET status = 'cancelled', \
        finished_at = now() - interval '2 minutes' WHERE shard_key = $1 AND id = $2";
    assert_eq!(sql(&shardq, cancel, parent).await, 1);

    let report = check(&shardq, options(&shardq)).await;
    let examples = only(&report, Invariant::CancelledChildrenLeft, 1);
    assert_eq!(examples[0].0, Some(parent));
    assert!(examples[0].1.contains("1 child(ren) left"), "{examples:?}");
    assert!(examples[0].1.contains(&child.to_string()), "{examples:?}");
    let patient = CheckOptions {
        child_grace: Duration::from_secs(600),
        ..options(&shardq)
    };
    assert_eq!(check(&shardq, patient).await.violations(), 0);

    shardq.client().cancel(parent).await.unwrap();
    assert_eq!(check(&shardq, options(&shardq)).await.violations(), 0);
}

/// Sleeping, messaging and child workflows run by a real worker (sends
/// that wake parked recvs, children that wake their parents, a cancel
/// that cascades, an abandoned child left running) while the check samples
/// the shard: no sample finds a violation, nor a final check that judges
/// every finished child and cancel at once (no grace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_run_of_waiting_workflows_breaks_no_invariant() {
    let (_shards, shardq) = shardq().await;
    let client = shardq.client();
    let mut jobs = Vec::new();
    for _ in 0..10 {
        jobs.push(NewJob::new(QUEUE, "waiter", json!({})));
        jobs.push(NewJob::new(QUEUE, "gatherer", json!({})));
        jobs.push(NewJob::new(QUEUE, "sleeper", json!({})));
    }
    let ids = client.enqueue_many(jobs).await.unwrap();
    let cancelled = client
        .enqueue(NewJob::new(
            QUEUE,
            "parent",
            json!({ "children": ["cancel", "abandon"] }),
        ))
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers()).run(stop.clone()));
    let (mut sent, mut samples) = (false, 0);
    let started = Instant::now();
    loop {
        let report = check(&shardq, options(&shardq)).await;
        assert_eq!(report.violations(), 0, "sample {samples}: {report:#?}");
        samples += 1;
        if !sent && samples >= 3 {
            for id in ids.iter().step_by(3) {
                client.send(*id, "go", json!("ok"), None).await.unwrap();
            }
            client.cancel(cancelled).await.unwrap();
            sent = true;
        }
        let mut open = Vec::new();
        for id in &ids {
            let status = client.job(*id).await.unwrap().unwrap().status;
            if !matches!(status.as_str(), "succeeded" | "dead" | "cancelled") {
                open.push(*id);
            }
        }
        // Completion is not what this test judges: it stops sampling after
        // 20 s with whatever is still open (see the assertion below).
        if sent && (open.is_empty() || started.elapsed() > Duration::from_secs(20)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    stop.cancel();
    worker.await.unwrap();
    let every = CheckOptions {
        child_grace: Duration::ZERO,
        ..options(&shardq)
    };
    let report = check(&shardq, every).await;
    assert_eq!(report.violations(), 0, "{report:#?}");
    let mut woken = [0, 0];
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 3 < 2) {
        let status = client.job(*id).await.unwrap().unwrap().status;
        woken[i % 3] += usize::from(status.as_str() == "succeeded");
    }
    let gatherers = ids.iter().enumerate().filter(|(i, _)| i % 3 == 1).count();
    assert!(woken[0] > 0, "waiters woken by sends: {woken:?}");
    assert_eq!(
        woken[1], gatherers,
        "every gatherer got its children's results"
    );
    let left = report.shards[0]
        .finding(Invariant::CancelledChildrenLeft)
        .unwrap();
    assert!(left.scanned >= 1, "the cancelled parent was read: {left:?}");
}

/// Each statement, under the check's settings, on a shard with parked
/// workflows, unreceived messages, children and finished history: index
/// walks only, never a sequential or bitmap scan of a workflow table (the
/// shard map's few move rows excepted); each read stops at its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_checks_walk_indexes_their_limits_stop() {
    let (_shards, shardq) = shardq().await;
    let db = shardq.shards().get(0).client().await.unwrap();
    db.batch_execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, status, parked, run_at) \
         SELECT g % 65536, 'q', 'noop', 'scheduled', true, now() + interval '10 minutes' \
         FROM generate_series(1, 20000) g; \
         INSERT INTO workflow_status (shard_key, queue, handler, status, finished_at) \
         SELECT g % 65536, 'q', 'noop', \
             (ARRAY['succeeded', 'cancelled', 'dead'])[1 + g % 3], now() - interval '1 hour' \
         FROM generate_series(1, 30000) g; \
         INSERT INTO workflow_status (shard_key, queue, handler, status, parent_shard_key, \
             parent_id) \
         SELECT w.shard_key, 'q', 'noop', 'queued', w.shard_key, w.id \
         FROM workflow_status w WHERE w.status = 'cancelled' LIMIT 5000; \
         INSERT INTO workflow_messages (shard_key, workflow_id, topic, message) \
         SELECT w.shard_key, w.id, 'go', '1' FROM workflow_status w \
         WHERE w.status = 'scheduled' LIMIT 10000; \
         ANALYZE workflow_status; ANALYZE workflow_messages; ANALYZE workflow_steps",
    )
    .await
    .unwrap();
    use shardq::store::sql;
    use tokio_postgres::types::Type;
    let (n, ms, recheck, shown) = (2000_i64, 60_000_i64, 3_600_000_i64, 5_i64);
    let asks: [(&str, Vec<shardq::store::sql::Param>); 5] = [
        (
            sql::CHECK_LOST_MESSAGE_WAKE,
            vec![(&n, Type::INT8), (&shown, Type::INT8)],
        ),
        (
            sql::CHECK_LOST_CHILD_WAKE,
            vec![
                (&n, Type::INT8),
                (&recheck, Type::INT8),
                (&ms, Type::INT8),
                (&shown, Type::INT8),
            ],
        ),
        (
            sql::CHECK_WAKE_NOT_RELAYED,
            vec![(&n, Type::INT8), (&ms, Type::INT8), (&shown, Type::INT8)],
        ),
        (
            sql::CHECK_PARENT_MISSING,
            vec![(&n, Type::INT8), (&ms, Type::INT8), (&shown, Type::INT8)],
        ),
        (
            sql::CHECK_CANCELLED_CHILDREN_LEFT,
            vec![(&n, Type::INT8), (&ms, Type::INT8), (&shown, Type::INT8)],
        ),
    ];
    let mut db = shardq.shards().get(0).client().await.unwrap();
    let tx = db.transaction().await.unwrap();
    let deadline = "20000".to_string();
    tx.query_typed(sql::CHECK_SETTINGS, &[(&deadline, Type::TEXT)])
        .await
        .unwrap();
    for (statement, params) in &asks {
        let plan = tx
            .query_typed(&format!("EXPLAIN {statement}"), params)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n");
        // The shard map's few move rows may be read whole.
        for unbounded in ["Seq Scan on workflow_", "Bitmap Heap Scan on workflow_"] {
            assert!(!plan.contains(unbounded), "{unbounded}:\n{plan}");
        }
    }
    tx.commit().await.unwrap();
    let report = check(&shardq, options(&shardq)).await;
    let capped = |i: Invariant| report.shards[0].finding(i).unwrap().capped;
    for bounded in [
        Invariant::LostMessageWake,
        Invariant::LostChildWake,
        Invariant::CancelledChildrenLeft,
    ] {
        assert!(capped(bounded), "{bounded}: {report:#?}");
    }
}
