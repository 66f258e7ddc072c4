//! Cancel cascades owed: a cancel writes, in its own transaction, the
//! cascade its children are owed, and the workers run it again until it
//! has reached every child. A canceller whose cascade failed (a child's
//! shard down) or that died before it leaves the children to the workers,
//! not running.

use crate::common;

use super::children_across::{
    children_on, first_child_of, identity_recorded, nth_key_on, running_parent, two_shards,
};
use super::children_across_outage::two_slots;
use common::wait_until;
use serde_json::json;
use shardq::client::{CheckOptions, Invariant};
use shardq::store::children_elsewhere::{self as elsewhere, ChildRow};
use shardq::{HandlerRegistry, JobId, NewJob, Shardq};
use shardq_local::StopMode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The cascades owed on shard `index`: (shard key, id) of each workflow.
async fn owed_on(shardq: &Shardq, index: usize) -> Vec<(i32, i64)> {
    let db = shardq.shards().get(index).client().await.unwrap();
    db.query(
        "SELECT shard_key, id FROM shardq_cascades_owed ORDER BY id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// A parent on shard 0 (running, claimed by hand) with a child on shard
/// 1, queued in a queue no worker serves: its identity recorded, the
/// child inserted, its start not recorded yet.
async fn parent_with_a_child_away(shardq: &Shardq) -> (JobId, JobId) {
    let parent = running_parent(shardq).await;
    let key = nth_key_on(shardq, 1, 0);
    let child = identity_recorded(shardq, parent, 1, &key).await;
    let payload = json!({});
    let row = ChildRow {
        id: child,
        parent,
        parent_deadline: None,
        job: &first_child_of(parent, &key, &payload),
    };
    elsewhere::insert(shardq.shards().get(1), row)
        .await
        .unwrap();
    (parent, child)
}

/// Whether `child` (on shard 1) is cancelled and `parent`'s cascade (on
/// shard 0) paid.
async fn cancelled_and_paid(shardq: &Shardq, parent: JobId, child: JobId) -> bool {
    children_on(shardq, 1, parent).await == vec![(child, "cancelled".to_string())]
        && owed_on(shardq, 0).await.is_empty()
}

/// A worker's pass finds the cascades due on `shardq`'s shards: makes
/// those owed on shard 0 due now (their first 10 s are the canceller's).
async fn due_now(shardq: &Shardq) {
    let db = shardq.shards().get(0).client().await.unwrap();
    db.execute("UPDATE shardq_cascades_owed SET due_at = now()", &[])
        .await
        .unwrap();
}

/// Runs a worker (of a queue the child is not in) until `done` holds.
async fn with_a_worker<F, Fut>(shardq: &Shardq, what: &str, done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut handlers = HandlerRegistry::new();
    handlers.register("noop", |_ctx| async { Ok(json!(null)) });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    wait_until(Duration::from_secs(30), what, done).await;
    stop.cancel();
    worker.await.unwrap();
}

/// The child's shard is down when its parent is cancelled: the cancel
/// answers with the error, the parent is cancelled and its cascade owed.
/// Once the shard is back, the workers cancel the child without a second
/// cancel, and the cascade is paid. Without the owed cascade, the child
/// would stay queued until someone cancelled the parent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascade_that_failed_on_a_down_shard_is_finished_by_the_workers() {
    let (shards, shardq) = two_slots("family", 2, 1000, 3000).await;
    let (parent, child) = parent_with_a_child_away(&shardq).await;

    shards.servers[1].stop(StopMode::Immediate).unwrap();
    let cancelled = shardq.client().cancel(parent).await;
    assert!(
        cancelled.is_err(),
        "the child's shard is down: {cancelled:?}"
    );
    assert_eq!(
        owed_on(&shardq, 0).await,
        vec![(parent.shard_key, parent.id)],
        "the cancel wrote its cascade as owed"
    );
    shards.servers[1].start_again().unwrap();
    wait_until(Duration::from_secs(30), "shard 1 answers", || async {
        shardq.shards().get(1).client().await.is_ok()
    })
    .await;
    assert_eq!(
        children_on(&shardq, 1, parent).await,
        vec![(child, "queued".to_string())],
        "no cascade reached the child yet"
    );

    due_now(&shardq).await;
    with_a_worker(
        &shardq,
        "the child cancelled, the cascades paid",
        || async {
            cancelled_and_paid(&shardq, parent, child).await
            // The child's own, written by its cancel: the cascade went
            // through it.
            && owed_on(&shardq, 1).await.is_empty()
        },
    )
    .await;
}

/// The canceller dies between its cancel of the parent and its cascade
/// (the store's cancel alone): the workers run the cascade it owed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceller_that_died_before_its_cascade_leaves_it_to_the_workers() {
    let (_shards, shardq) = two_shards("family", 1, 100).await;
    let (parent, child) = parent_with_a_child_away(&shardq).await;
    let home = shardq.shards().get(0);
    assert!(shardq::store::jobs::cancel(home, parent)
        .await
        .unwrap()
        .is_some());

    due_now(&shardq).await;
    with_a_worker(&shardq, "the child cancelled, the cascade paid", || {
        cancelled_and_paid(&shardq, parent, child)
    })
    .await;
}

/// Anyone may owe a debt again (`shardq_owe_cascades` runs with the
/// owner's rights, for producers that cancel): a debt owed again keeps its
/// earlier due time, so calls every few seconds cannot put off forever the
/// workers' cascade of a canceller that died.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owing_a_debt_again_never_puts_off_its_cascade() {
    let (_shards, shardq) = two_shards("family", 1, 100).await;
    let (parent, _child) = parent_with_a_child_away(&shardq).await;
    let home = shardq.shards().get(0);
    shardq::store::jobs::cancel(home, parent)
        .await
        .unwrap()
        .expect("cancelled");
    due_now(&shardq).await;
    let db = home.client().await.unwrap();
    db.execute(
        "SELECT shardq_owe_cascades(ARRAY[$1::int], ARRAY[$2::bigint])",
        &[&parent.shard_key, &parent.id],
    )
    .await
    .unwrap();
    let due: bool = db
        .query_one(
            "SELECT due_at <= now() FROM shardq_cascades_owed WHERE shard_key = $1 AND id = $2",
            &[&parent.shard_key, &parent.id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(due, "still due for the workers' pass");
}

/// A cancel whose cascade reached every child leaves nothing owed: the
/// canceller paid it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascade_that_reached_every_child_is_not_owed() {
    let (_shards, shardq) = two_shards("family", 1, 100).await;
    let (parent, child) = parent_with_a_child_away(&shardq).await;
    shardq.client().cancel(parent).await.unwrap();
    assert_eq!(
        children_on(&shardq, 1, parent).await,
        vec![(child, "cancelled".to_string())]
    );
    assert!(
        owed_on(&shardq, 0).await.is_empty(),
        "paid by the canceller"
    );
}

/// A cancelled parent put back by a retry before the workers ran its
/// cascade: the pass pays the debt without cancelling its children, which
/// are its own again (the replay may await them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debt_of_a_parent_retried_since_is_paid_without_a_cascade() {
    let (_shards, shardq) = two_shards("family", 1, 100).await;
    let (parent, child) = parent_with_a_child_away(&shardq).await;
    let home = shardq.shards().get(0);
    shardq::store::jobs::cancel(home, parent).await.unwrap();
    // Its run ends at its next step, cancelled; an operator retries it.
    let db = home.client().await.unwrap();
    db.execute(
        "UPDATE workflow_status SET status = 'cancelled', owner = NULL, \
            lease_expires_at = NULL, finished_at = now() WHERE shard_key = $1 AND id = $2",
        &[&parent.shard_key, &parent.id],
    )
    .await
    .unwrap();
    assert!(shardq.client().retry(parent).await.unwrap());

    due_now(&shardq).await;
    let pass = shardq::store::cascades_owed::run_due(shardq.shards(), 0, 10)
        .await
        .unwrap();
    assert_eq!((pass.taken, pass.done, pass.changed), (1, 1, 0), "{pass:?}");
    assert_eq!(
        children_on(&shardq, 1, parent).await,
        vec![(child, "queued".to_string())],
        "the retried parent's child is left alone"
    );
    assert!(owed_on(&shardq, 0).await.is_empty());
}

/// A cascade pays the debt it read, not a later cancel's: cancelled,
/// retried, cancelled again, the first generation's payment leaves the
/// second debt owed; its own generation pays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_leaves_the_debt_of_a_later_cancel() {
    let (_shards, shardq) = two_shards("family", 1, 100).await;
    let client = shardq.client();
    let id = client
        .enqueue(NewJob::new("idle", "never_runs", json!({})))
        .await
        .unwrap();
    let shard = shardq.shards().for_key(id.shard_key);
    let first = shardq::store::jobs::cancel_owing(shard, id)
        .await
        .unwrap()
        .unwrap();
    assert!(client.retry(id).await.unwrap());
    let second = shardq::store::jobs::cancel_owing(shard, id)
        .await
        .unwrap()
        .unwrap();
    assert!(second.owed > first.owed, "{first:?} then {second:?}");

    use shardq::store::cascade_debts::paid;
    paid(shard, &[(id, first.owed)]).await.unwrap();
    let owed_here = owed_on(&shardq, shard.index).await;
    assert_eq!(owed_here, vec![(id.shard_key, id.id)], "the later debt");
    paid(shard, &[(id, second.owed)]).await.unwrap();
    assert!(owed_on(&shardq, shard.index).await.is_empty());
}

/// `shardq check` reports a cascade owed past the grace (none of a
/// fresh one), naming the workflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_cascade_owed_past_the_grace() {
    let (_shards, shardq) = two_shards("family", 1, 100).await;
    let (parent, _child) = parent_with_a_child_away(&shardq).await;
    let home = shardq.shards().get(0);
    shardq::store::jobs::cancel(home, parent).await.unwrap();
    let options = CheckOptions::from_config(shardq.config());
    let owed = |report: &shardq::client::CheckReport| {
        report.shards[0]
            .finding(Invariant::CascadeOwed)
            .unwrap()
            .clone()
    };
    let fresh = owed(&shardq.client().check(&options).await);
    assert_eq!(fresh.broken, 0, "{fresh:?}");

    let db = home.client().await.unwrap();
    db.execute(
        "UPDATE shardq_cascades_owed SET owed_since = now() - interval '5 minutes'",
        &[],
    )
    .await
    .unwrap();
    let old = owed(&shardq.client().check(&options).await);
    assert_eq!(old.broken, 1, "{old:?}");
    assert_eq!(old.examples[0].job, Some(parent));
    assert!(
        old.examples[0].detail.contains("owed a cancel for 300"),
        "{old:?}"
    );
}

/// A cascade that stopped right after cancelling a child (a parked
/// workflow with a child of its own) leaves that child's own debt: the
/// workers' pass on the child's shard cancels the grandchild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grandchild_is_reached_through_its_parents_own_debt() {
    let (_shards, shardq) = two_shards("family", 1, 100).await;
    let (_parent, child) = parent_with_a_child_away(&shardq).await;
    let there = shardq.shards().get(1);
    let db = there.client().await.unwrap();
    let grandchild: i64 = db
        .query_one(
            "INSERT INTO workflow_status (shard_key, queue, handler, status, \
                parent_shard_key, parent_id) \
             VALUES ($1, 'idle', 'x', 'queued', $1, $2) RETURNING id",
            &[&child.shard_key, &child.id],
        )
        .await
        .unwrap()
        .get(0);
    // The cascade cancels the child, then its process dies.
    assert!(shardq::store::jobs::cancel(there, child)
        .await
        .unwrap()
        .is_some());
    assert_eq!(owed_on(&shardq, 1).await, vec![(child.shard_key, child.id)]);

    db.execute("UPDATE shardq_cascades_owed SET due_at = now()", &[])
        .await
        .unwrap();
    let pass = shardq::store::cascades_owed::run_due(shardq.shards(), 1, 10)
        .await
        .unwrap();
    assert_eq!((pass.taken, pass.done, pass.changed), (1, 1, 1), "{pass:?}");
    let status: String = db
        .query_one(
            "SELECT status FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&child.shard_key, &grandchild],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "cancelled");
    assert!(owed_on(&shardq, 1).await.is_empty());
}

/// The exporter shows each shard's cascades owed and the oldest's age
/// while one is owed; once paid, none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exporter_shows_the_cascades_owed_until_they_are_paid() {
    let (_shards, shardq) = two_shards("family", 1, 100).await;
    let (parent, child) = parent_with_a_child_away(&shardq).await;
    let home = shardq.shards().get(0);
    shardq::store::jobs::cancel(home, parent).await.unwrap();
    let db = home.client().await.unwrap();
    db.execute(
        "UPDATE shardq_cascades_owed SET owed_since = now() - interval '5 s'",
        &[],
    )
    .await
    .unwrap();
    let check = CheckOptions::from_config(shardq.config());
    let client = shardq.client();
    let scrape = || shardq::prometheus::backlog::scrape_with_check(&client, &[], &check);
    let gauge = |text: &str, name: &str, shard: &str| -> Option<f64> {
        let series = format!("{name}{{shard=\"{shard}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .map(|v| v.parse().expect("a number"))
    };
    let text = scrape().await;
    assert_eq!(
        gauge(&text, "shardq_cancel_cascades_owed", "s0"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        gauge(&text, "shardq_cancel_cascades_owed", "s1"),
        Some(0.0),
        "{text}"
    );
    let age = gauge(&text, "shardq_cancel_cascade_oldest_seconds", "s0").unwrap();
    assert!((4.0..60.0).contains(&age), "{age}");

    due_now(&shardq).await;
    let pass = shardq::store::cascades_owed::run_due(shardq.shards(), 0, 10)
        .await
        .unwrap();
    assert_eq!(pass.done, 1, "{pass:?}");
    assert_eq!(
        children_on(&shardq, 1, parent).await,
        vec![(child, "cancelled".to_string())]
    );
    let text = scrape().await;
    assert_eq!(
        gauge(&text, "shardq_cancel_cascades_owed", "s0"),
        Some(0.0),
        "{text}"
    );
}

/// The deadline pass ends a parent while its child's shard is down: the
/// pass's own cascade fails, the debt stays, and once the shard is back
/// the workers cancel the child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlines_cascade_that_failed_on_a_down_shard_is_finished_by_the_workers() {
    let (shards, shardq) = two_slots("family", 2, 1000, 3000).await;
    let (parent, child) = parent_with_a_child_away(&shardq).await;
    let home = shardq.shards().get(0).client().await.unwrap();
    home.execute(
        "UPDATE workflow_status SET deadline_at = now() + interval '2 seconds' \
         WHERE shard_key = $1 AND id = $2",
        &[&parent.shard_key, &parent.id],
    )
    .await
    .unwrap();
    shards.servers[1].stop(StopMode::Immediate).unwrap();

    let mut handlers = HandlerRegistry::new();
    handlers.register("noop", |_ctx| async { Ok(json!(null)) });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(handlers).run(stop.clone()));
    wait_until(
        Duration::from_secs(30),
        "the parent ended by its deadline",
        || async {
            home.query_one(
                "SELECT cancel_requested FROM workflow_status WHERE shard_key = $1 AND id = $2",
                &[&parent.shard_key, &parent.id],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
        },
    )
    .await;
    // Its cascade cannot reach the child: the debt stays.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        owed_on(&shardq, 0).await,
        vec![(parent.shard_key, parent.id)],
        "owed while the child's shard is down"
    );

    shards.servers[1].start_again().unwrap();
    due_now(&shardq).await;
    wait_until(
        Duration::from_secs(30),
        "the child cancelled, the cascade paid",
        || cancelled_and_paid(&shardq, parent, child),
    )
    .await;
    stop.cancel();
    worker.await.unwrap();
}
