//! Children across shards, two more races: a parent cancelled between its
//! child's identity and the child's insert (its process then dies before
//! it can cancel the child itself), and a relayed wake of a child that
//! was retried and finished again before the relay cleared its flag; and
//! `shardq check`'s report of a wake the relay did not deliver in time.

use crate::common;

use super::children_across::{
    children_on, first_child_of, identity_recorded, named, nth_key_on, running_parent,
};
use super::children_across_races::sk;
use common::TestShards;
use serde_json::json;
use shardq::client::{CheckOptions, Invariant};
use shardq::store::children_elsewhere::{self as elsewhere, ChildRow, Intent, ParentStep};
use shardq::{JobId, Shardq};

async fn shardq() -> (TestShards, Shardq) {
    super::children_across_races::shardq(2).await
}

/// A child on shard 0, finished `ago` (SQL interval text), whose wake to
/// parent `parent_id` on shard 1 is owed (that parent is not there: a
/// wake delivered to it is done). Returns its id.
async fn finished_child_owing(shardq: &Shardq, parent_id: i64, ago: &str) -> i64 {
    let child_key = sk(&nth_key_on(shardq, 0, 0));
    let parent_key = sk(&nth_key_on(shardq, 1, 0));
    let c = shardq.shards().get(0).client().await.unwrap();
    let insert = format!(
        "INSERT INTO workflow_status (shard_key, queue, handler, status, finished_at, \
            parent_shard_key, parent_id, parent_wake) \
         VALUES ($1, 'idle', 'x', 'succeeded', now() - interval '{ago}', $2, $3, true) \
         RETURNING id"
    );
    c.query_one(insert.as_str(), &[&child_key, &parent_key, &parent_id])
        .await
        .unwrap()
        .get(0)
}

/// Run 1 of a parent on shard 0 records the identities of two children on
/// shard 1 and inserts the first; the parent is cancelled (its cascade
/// runs), then run 1 inserts the second and dies before it records either
/// start or cancels anything. Neither child may run: the first is
/// cancelled by the cascade, and the second's insert finds the cascade's
/// cancelled stand-in and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_cancelled_before_its_childs_insert_never_starts_that_child() {
    let (_s, shardq) = shardq().await;
    let parent = running_parent(&shardq).await;
    let (home, there) = (shardq.shards().get(0), shardq.shards().get(1));
    let keys = [nth_key_on(&shardq, 1, 0), nth_key_on(&shardq, 1, 1)];
    let payload = json!({});
    let mut kids = Vec::new();
    for (n, key) in keys.iter().enumerate() {
        let step = ParentStep {
            parent,
            name: ["shardq:child:1", "shardq:child:2"][n],
            owner: "racer",
            fence: 7,
        };
        let id = JobId {
            shard_key: sk(key),
            id: elsewhere::reserve_id(there, sk(key)).await.unwrap(),
        };
        assert_eq!(
            elsewhere::intent(home, step, named(id)).await.unwrap(),
            Intent::Reserved(id, None)
        );
        kids.push(id);
    }
    let insert = |n: usize, start| ChildRow {
        id: kids[n],
        parent,
        parent_deadline: None,
        job: start,
    };
    let first = first_child_of(parent, &keys[0], &payload);
    let second = first_child_of(parent, &keys[1], &payload);
    elsewhere::insert(there, insert(0, &first)).await.unwrap();

    shardq.client().cancel(parent).await.unwrap();
    // Run 1, still going: its insert of the second child.
    elsewhere::insert(there, insert(1, &second)).await.unwrap();

    let mut expected = vec![
        (kids[0], "cancelled".to_string()),
        (kids[1], "cancelled".to_string()),
    ];
    expected.sort_by_key(|(id, _)| id.id);
    assert_eq!(children_on(&shardq, 1, parent).await, expected);
    let error: Option<String> = there
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT error FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&kids[1].shard_key, &kids[1].id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        error.as_deref(),
        Some("cancelled with its parent before it started")
    );
    // A stand-in holds nothing of the child to run: it is not retried.
    assert!(!shardq.client().retry(kids[1]).await.unwrap());
}

/// The same gap when the child's key has come to the parent's own shard
/// since its identity was recorded (a move): the run's insert goes to
/// the parent's shard, so the cascade writes the stand-in there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stand_in_is_written_on_the_parents_shard_when_the_childs_key_is_there() {
    let (_s, shardq) = shardq().await;
    let parent = running_parent(&shardq).await;
    let home = shardq.shards().get(0);
    let key = nth_key_on(&shardq, 0, 1);
    let payload = json!({});
    let start = first_child_of(parent, &key, &payload);
    let id = identity_recorded(&shardq, parent, 0, &key).await;
    shardq.client().cancel(parent).await.unwrap();
    let row = ChildRow {
        id,
        parent,
        parent_deadline: None,
        job: &start,
    };
    elsewhere::insert(home, row).await.unwrap();
    assert_eq!(
        children_on(&shardq, 0, parent).await,
        vec![(id, "cancelled".to_string())]
    );
}

/// A child on shard 0 finished; the relay read its wake, owed to a parent
/// on shard 1. Before the relay cleared the flag, the child was retried
/// and finished again (its trigger flags a new wake). The clear must leave
/// that second flag: the next pass delivers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_clears_only_the_wake_of_the_finish_it_read() {
    let (_s, shardq) = shardq().await;
    let c = shardq.shards().get(0).client().await.unwrap();
    let child = finished_child_owing(&shardq, 424242, "1 minute").await;
    let owed = elsewhere::wakes_owed(shardq.shards(), 0, &[])
        .await
        .unwrap();
    assert_eq!(owed[&1].len(), 1);
    // Retried, and finished again.
    c.batch_execute(&format!(
        "UPDATE workflow_status SET status = 'queued', finished_at = NULL WHERE id = {child}; \
         UPDATE workflow_status SET status = 'succeeded', finished_at = now() WHERE id = {child}"
    ))
    .await
    .unwrap();
    let done = elsewhere::deliver(shardq.shards(), 0, 1, &owed[&1])
        .await
        .unwrap();
    assert_eq!(done, 1, "the parent's shard took the first wake");
    let flag: Option<bool> = c
        .query_one(
            "SELECT parent_wake FROM workflow_status WHERE id = $1",
            &[&child],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(flag, Some(true), "the second finish's wake is still owed");
    let owed = elsewhere::wakes_owed(shardq.shards(), 0, &[])
        .await
        .unwrap();
    assert_eq!(
        elsewhere::deliver(shardq.shards(), 0, 1, &owed[&1])
            .await
            .unwrap(),
        1
    );
    let flag: Option<bool> = c
        .query_one(
            "SELECT parent_wake FROM workflow_status WHERE id = $1",
            &[&child],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(flag, None, "delivered, cleared");
}

/// Wakes owed to a parent on another shard, not relayed (no worker runs):
/// the one of a child that finished two minutes ago is reported by
/// `shardq check` on the child's shard (`wake_not_relayed`), naming the
/// child and its parent; one that finished just now is within the grace.
/// `shardq status` shows both as owed to shard 1. Once the relay delivers
/// them, the report is clean and nothing is owed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_not_relayed_in_time_is_reported() {
    let (_s, shardq) = shardq().await;
    let stale = finished_child_owing(&shardq, 424242, "2 minutes").await;
    finished_child_owing(&shardq, 434343, "0 seconds").await;
    let options = CheckOptions::from_config(shardq.config());
    let report = shardq.client().check(&options).await;
    assert_eq!(
        report.broken_invariants(),
        vec![Invariant::WakeNotRelayed],
        "{report:#?}"
    );
    let finding = report.shards[0].finding(Invariant::WakeNotRelayed).unwrap();
    assert_eq!(finding.broken, 1, "{report:#?}");
    let example = &finding.examples[0];
    let parent_key = sk(&nth_key_on(&shardq, 1, 0));
    let stale = JobId {
        shard_key: sk(&nth_key_on(&shardq, 0, 0)),
        id: stale,
    };
    assert_eq!(example.job, Some(stale));
    let parent = format!("{parent_key}-424242");
    assert!(example.detail.contains(&parent), "{}", example.detail);

    // `shardq status` shows them on the child's shard, by destination.
    let status = shardq.client().status().await;
    let owed = &status[0].wakes_owed;
    assert_eq!(owed.len(), 1, "{owed:?}");
    assert_eq!((owed[0].to, owed[0].pending), (1, 2));
    assert!(owed[0].oldest_s >= 119.0, "{owed:?}");
    assert!(status[1].wakes_owed.is_empty());

    let owed = elsewhere::wakes_owed(shardq.shards(), 0, &[])
        .await
        .unwrap();
    let done = elsewhere::deliver(shardq.shards(), 0, 1, &owed[&1])
        .await
        .unwrap();
    assert_eq!(done, 2);
    assert_eq!(shardq.client().check(&options).await.violations(), 0);
    assert!(shardq.client().status().await[0].wakes_owed.is_empty());

    // A flagged child retried before its wake was delivered (its
    // `finished_at` cleared, its flag kept): counted, with no age.
    let retried = finished_child_owing(&shardq, 454545, "1 minute").await;
    shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET status = 'queued', finished_at = NULL WHERE id = $1",
            &[&retried],
        )
        .await
        .unwrap();
    let status = shardq.client().status().await;
    assert_eq!(status[0].wakes_owed.len(), 1, "{:?}", status[0].wakes_owed);
    assert_eq!(status[0].wakes_owed[0].oldest_s, 0.0);
}
