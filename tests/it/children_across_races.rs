//! Children across shards, the races around a reshard and a relay: a wake
//! owed to a parent held by a move waits for the move; wakes piling up for
//! a shard whose delivery is out never hide the others'; a start whose
//! identity was recorded keeps it when the child's key comes to the
//! parent's shard; a second result() of a run never undoes a wake already
//! delivered. (Found by review, each shown failing before its fix.)

use crate::common;

use super::children_across::{children_on, first_child_of, named, nth_key_on, running_parent};
use common::TestShards;
use serde_json::json;
use shardq::store::children::{self, Started};
use shardq::store::children_elsewhere::{self as elsewhere, ChildRow, Intent, ParentStep};
use shardq::{JobId, NewJob, Shardq};
use std::time::Duration;

const IDLE: &str = "idle";

pub(crate) async fn shardq(n: usize) -> (TestShards, Shardq) {
    let shards = TestShards::databases(n).await;
    let config = shards.config("[worker]\nqueues = [\"family\"]\nconcurrency = 1\n");
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    (shards, shardq)
}

pub(crate) fn sk(key: &str) -> i32 {
    shardq::router::shard_key_for(key)
}

/// 1,000 wakes owed to shard 1 (whose delivery is out: a frozen shard)
/// sort before one owed to shard 2: the relay's read, told shard 1 is
/// busy, still returns shard 2's (the filter comes before the limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakes_piling_up_for_a_busy_shard_never_hide_the_others() {
    let (_s, shardq) = shardq(3).await;
    let child_key = sk(&nth_key_on(&shardq, 0, 0));
    let p1 = sk(&nth_key_on(&shardq, 1, 0));
    let p2 = sk(&nth_key_on(&shardq, 2, 0));
    let c = shardq.shards().get(0).client().await.unwrap();
    c.execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, status, finished_at, \
            parent_shard_key, parent_id, parent_wake) \
         SELECT $1, 'idle', 'x', 'succeeded', now(), $2, g, true \
         FROM generate_series(1, 1000) g",
        &[&child_key, &p1],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, status, finished_at, \
            parent_shard_key, parent_id, parent_wake) \
         VALUES ($1, 'idle', 'x', 'succeeded', now(), $2, 1, true)",
        &[&child_key, &p2],
    )
    .await
    .unwrap();
    let owed = elsewhere::wakes_owed(shardq.shards(), 0, &[])
        .await
        .unwrap();
    assert_eq!(
        owed.get(&1).map(Vec::len),
        Some(1000),
        "the read is bounded"
    );
    assert!(!owed.contains_key(&2));
    let owed = elsewhere::wakes_owed(shardq.shards(), 0, &[1])
        .await
        .unwrap();
    assert!(!owed.contains_key(&1));
    assert_eq!(
        owed.get(&2).map(Vec::len),
        Some(1),
        "shard 2's wake is read"
    );
}

/// A parked parent marked `held` by a range move (RESHARD_MARK) is owed
/// its child's wake: the delivery is not done while it is held (the
/// child's flag stays), and once the move releases it the next delivery
/// wakes it. (It was taken as done, and the parent stayed parked an hour.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_owed_to_a_parent_held_by_a_move_waits_for_the_move() {
    let (_s, shardq) = shardq(2).await;
    let parent = shardq
        .client()
        .enqueue(NewJob::new(IDLE, "p", json!({})).ordering_key(nth_key_on(&shardq, 1, 0)))
        .await
        .unwrap();
    let child = shardq
        .client()
        .enqueue(NewJob::new(IDLE, "c", json!({})).ordering_key(nth_key_on(&shardq, 0, 0)))
        .await
        .unwrap();
    let home = shardq.shards().get(1).client().await.unwrap();
    // The parent parked on its child (the wait recorded, run_at an hour
    // ahead), then marked held by a move of its range.
    home.execute(
        "UPDATE workflow_status SET status = 'held', held_status = 'scheduled', \
            run_at = now() + interval '1 hour', attempts = 0, fence = 1 \
         WHERE shard_key = $1 AND id = $2",
        &[&parent.shard_key, &parent.id],
    )
    .await
    .unwrap();
    home.execute(
        "INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output) \
         VALUES ($1, $2, 'shardq:child:1:result:wait', \
                 jsonb_build_object('child_shard_key', $3::int, 'child_id', $4::bigint))",
        &[&parent.shard_key, &parent.id, &child.shard_key, &child.id],
    )
    .await
    .unwrap();
    // The child finishes (its trigger flags the wake).
    shardq
        .shards()
        .get(0)
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET parent_shard_key = $3, parent_id = $4, \
                status = 'succeeded', finished_at = now() \
             WHERE shard_key = $1 AND id = $2",
            &[&child.shard_key, &child.id, &parent.shard_key, &parent.id],
        )
        .await
        .unwrap();
    let owed = elsewhere::wakes_owed(shardq.shards(), 0, &[])
        .await
        .unwrap();
    let delivered = elsewhere::deliver(shardq.shards(), 0, 1, &owed[&1])
        .await
        .unwrap();
    // The move releases the range.
    home.execute(
        "UPDATE workflow_status SET status = held_status, held_status = NULL \
         WHERE shard_key = $1 AND id = $2",
        &[&parent.shard_key, &parent.id],
    )
    .await
    .unwrap();
    let due: bool = home
        .query_one(
            "SELECT run_at <= now() + interval '1 minute' FROM workflow_status \
             WHERE shard_key = $1 AND id = $2",
            &[&parent.shard_key, &parent.id],
        )
        .await
        .unwrap()
        .get(0);
    let flagged: Option<bool> = shardq
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
        .get(0);
    assert_eq!(delivered, 0, "not done while the parent is held");
    assert!(!due, "the held parent was not woken");
    assert_eq!(flagged, Some(true), "the child's flag stays");
    let owed = elsewhere::wakes_owed(shardq.shards(), 0, &[])
        .await
        .unwrap();
    let delivered = elsewhere::deliver(shardq.shards(), 0, 1, &owed[&1])
        .await
        .unwrap();
    assert_eq!(delivered, 1);
    let due: bool = home
        .query_one(
            "SELECT run_at <= now() + interval '1 minute' FROM workflow_status \
             WHERE shard_key = $1 AND id = $2",
            &[&parent.shard_key, &parent.id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(due, "woken once the move released it");
}

/// Run 1 started a child through the cross-shard path (identity recorded
/// as `shardq:child:1:id`, row inserted) and crashed before the start was
/// recorded; the child's range then moved to the parent's shard (the row
/// moved with its id). Run 2 routes the child locally: shardq_start_child
/// defers to the recorded identity (it inserted a second child), and the
/// cross-shard path then finds the row there. One child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_identity_keeps_its_child_when_the_key_comes_to_the_parents_shard() {
    let (_s, shardq) = shardq(2).await;
    let parent = running_parent(&shardq).await;
    let home = shardq.shards().get(0);
    // The child's key: on shard 0 now (where run 1's child row moved to).
    let child_key = nth_key_on(&shardq, 0, 1);
    let payload = json!({});
    let start = first_child_of(parent, &child_key, &payload);
    let step = ParentStep {
        parent,
        name: "shardq:child:1",
        owner: "racer",
        fence: 7,
    };
    let first = JobId {
        shard_key: sk(&child_key),
        id: elsewhere::reserve_id(home, sk(&child_key)).await.unwrap(),
    };
    assert_eq!(
        elsewhere::intent(home, step, named(first)).await.unwrap(),
        Intent::Reserved(first, None)
    );
    elsewhere::insert(
        home,
        ChildRow {
            id: first,
            parent,
            parent_deadline: None,
            job: &start,
        },
    )
    .await
    .unwrap();
    // Run 2 (same fence for brevity): the key routes here, the local path.
    let again = children::start(home, start).await.unwrap();
    let n = children_on(&shardq, 0, parent).await.len();
    assert_eq!(
        again,
        Started::OtherShard(first.shard_key, None),
        "children: {n}"
    );
    assert_eq!(n, 1, "one child per call site");
    assert_eq!(
        elsewhere::intent(home, step, named(first)).await.unwrap(),
        Intent::Reserved(first, None),
        "the identity recorded first"
    );
    elsewhere::insert(
        home,
        ChildRow {
            id: first,
            parent,
            parent_deadline: None,
            job: &start,
        },
    )
    .await
    .unwrap();
    let n = children_on(&shardq, 0, parent).await.len();
    assert_eq!(n, 1, "its insert found the row");
}

/// A parent gathering two children on another shard concurrently (two
/// result() calls in one run): child 1 is read unfinished, finishes, and
/// its relayed wake makes the running parent due; then child 2's wait
/// statement runs (child 2 is finished). The parent stays due: the wait
/// pushes `run_at` out only while no wake came in the run. (It pushed it
/// an hour out, and child 1's wake was lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_result_in_a_run_keeps_a_wake_already_delivered() {
    let (_s, shardq) = shardq(2).await;
    let parent = running_parent(&shardq).await;
    let home = shardq.shards().get(0);
    let there = shardq.shards().get(1);
    let mut kids = Vec::new();
    for n in 0..2 {
        let c = shardq
            .client()
            .enqueue(NewJob::new(IDLE, "c", json!({})).ordering_key(nth_key_on(&shardq, 1, n)))
            .await
            .unwrap();
        there
            .client()
            .await
            .unwrap()
            .execute(
                "UPDATE workflow_status SET parent_shard_key = $3, parent_id = $4 \
                 WHERE shard_key = $1 AND id = $2",
                &[&c.shard_key, &c.id, &parent.shard_key, &parent.id],
            )
            .await
            .unwrap();
        kids.push(c);
    }
    let finish = |c: JobId| async move {
        there
            .client()
            .await
            .unwrap()
            .execute(
                "UPDATE workflow_status SET status = 'succeeded', finished_at = now() \
                 WHERE shard_key = $1 AND id = $2",
                &[&c.shard_key, &c.id],
            )
            .await
            .unwrap();
    };
    let step = |name| ParentStep {
        parent,
        name,
        owner: "racer",
        fence: 7,
    };
    let recheck = Duration::from_secs(3600);
    // Child 2 finished early (nothing waits on it yet).
    finish(kids[1]).await;
    // result() of child 1: wait recorded, child read unfinished.
    let w1 = elsewhere::wait(home, step("shardq:child:1:result"), kids[0], recheck)
        .await
        .unwrap();
    assert_eq!(w1, elsewhere::Wait::Recorded);
    assert_eq!(
        elsewhere::read_child(there, kids[0]).await.unwrap(),
        Some(None)
    );
    // Child 1 finishes; the relay delivers (the running parent is made due).
    finish(kids[0]).await;
    let owed = elsewhere::wakes_owed(shardq.shards(), 1, &[])
        .await
        .unwrap();
    let done = elsewhere::deliver(shardq.shards(), 1, 0, &owed[&0])
        .await
        .unwrap();
    assert_eq!(done, 2);
    // result() of child 2 in the same run: its wait statement, then its read.
    let w2 = elsewhere::wait(home, step("shardq:child:2:result"), kids[1], recheck)
        .await
        .unwrap();
    assert_eq!(w2, elsewhere::Wait::Recorded);
    assert!(elsewhere::read_child(there, kids[1])
        .await
        .unwrap()
        .unwrap()
        .is_some());
    // The run now parks on child 1 (its read said unfinished).
    let due: bool = home
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT run_at <= now() + interval '1 minute' FROM workflow_status \
             WHERE shard_key = $1 AND id = $2",
            &[&parent.shard_key, &parent.id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        due,
        "child 1's delivered wake was overwritten: the parent parks an hour"
    );
}
