//! A parent parked on its child moves with it: the child (which takes its
//! parent's shard key) and its link (`parent_shard_key`, `parent_id`) and
//! the parent's wait are copied with the key range, and on the new shard
//! the child's completion wakes the parent.

use super::{growing_to_three, moving_key, GrowingToThree, WORKER_TOML};
use crate::common::TestShards;
use serde_json::json;
use shardq::reshard::{reshard, Options};
use shardq::shards::Shard;
use shardq::store::children::{self, AwaitChild, Awaited, StartChild, Started};
use shardq::{ChildResult, Client, HandlerRegistry, JobId, JobOutcome, NewJob, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const OWNER: &str = "racer";
const FENCE: i64 = 7;

/// The children of `parent` on `shard`.
async fn children_on(shard: &Shard, parent: JobId) -> Vec<i64> {
    shard
        .client()
        .await
        .unwrap()
        .query(
            "SELECT id FROM workflow_status WHERE parent_shard_key = $1 AND parent_id = $2",
            &[&parent.shard_key, &parent.id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_parent_and_its_child_move_together_and_the_child_wakes_it() {
    let GrowingToThree {
        servers: _servers,
        new,
        all,
        plan,
        ..
    } = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let client = Client::new(&new).unwrap();
    let key = moving_key(&plan, "family");
    let parent = client
        .enqueue(NewJob::new("moving", "parent", json!({})).ordering_key(key))
        .await
        .unwrap();
    let m = plan
        .moves
        .iter()
        .find(|m| m.first_key <= parent.shard_key && parent.shard_key < m.end_key)
        .unwrap();
    let (from, to) = (all.get(m.from_index), all.get(2));

    // The parent's first run, by hand on the old shard: it starts its
    // child, waits for it, and parks.
    let db = from.client().await.unwrap();
    db.execute(
        "UPDATE workflow_status SET status = 'running', owner = $3, fence = $4, attempts = 1, \
            started_at = now(), lease_expires_at = now() + interval '1 hour' \
         WHERE shard_key = $1 AND id = $2",
        &[&parent.shard_key, &parent.id, &OWNER, &FENCE],
    )
    .await
    .unwrap();
    let payload = json!({ "n": 7 });
    let started = children::start(
        from,
        StartChild {
            parent,
            name: "shardq:child:1",
            owner: OWNER,
            fence: FENCE,
            queue: "moving",
            handler: "child",
            payload: &payload,
            ordering_key: None,
            group: None,
            priority: 0,
            delay: Duration::ZERO,
            max_attempts: 3,
            abandon_on_parent_cancel: false,
            timeout_ms: None,
        },
    )
    .await
    .unwrap();
    let Started::Child(child) = started else {
        panic!("{started:?}")
    };
    assert_eq!(child.shard_key, parent.shard_key, "the parent's shard key");
    let wait = AwaitChild {
        parent,
        name: "shardq:child:1:result",
        child,
        owner: OWNER,
        fence: FENCE,
        recheck: Duration::from_secs(3600),
    };
    let waiting = children::result(from, wait).await.unwrap();
    assert!(matches!(waiting, Awaited::Waiting(_)), "{waiting:?}");
    db.execute(
        "SELECT * FROM shardq_complete_many(ARRAY[$1::int], ARRAY[$2::bigint], \
            ARRAY[$3::bigint], ARRAY['parked'], ARRAY[NULL::jsonb], $4, ARRAY[NULL::text], 10, 20)",
        &[&parent.shard_key, &parent.id, &FENCE, &OWNER],
    )
    .await
    .unwrap();

    let summary = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    assert_eq!(children_on(to, parent).await, vec![child.id], "moved");
    assert!(children_on(from, parent).await.is_empty(), "removed");

    // On the new shard the child runs; its completion wakes the parent,
    // parked an hour ahead, whose replay finds its child finished.
    let mut handlers = HandlerRegistry::new();
    handlers.register("child", |ctx| async move {
        Ok(json!(ctx.payload["n"].as_i64().unwrap_or(0) * 10))
    });
    handlers.register("parent", |ctx| async move {
        let child = ctx
            .start_child(NewJob::new("moving", "child", json!({ "n": 7 })))
            .await?;
        match child.result().await? {
            ChildResult::Succeeded(v) => Ok(json!({ "child": v })),
            other => Ok(json!(format!("{other:?}"))),
        }
    });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(Worker::new(new.clone(), all.clone(), handlers).run(stop.clone()));
    let outcome = client
        .result(parent, Duration::from_secs(30))
        .await
        .unwrap();
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(outcome, JobOutcome::Succeeded(json!({ "child": 70 })));
    assert_eq!(children_on(to, parent).await, vec![child.id], "one child");
}

/// A move copies only unclaimed jobs: a running parent's queued child
/// moves to the new shard while the parent finishes on the old one. On the
/// new shard the child's parent is then absent, and rightly so: `shardq
/// check` does not take it for a child whose parent is missing (the child's
/// id is below the move's `ids_from`: it was created before the move).
/// Deleting a parent created after the move, beside its child, is found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_moved_without_its_finished_parent_is_not_reported_missing() {
    use shardq::client::{CheckOptions, Invariant};
    use shardq::reshard::Step;
    let GrowingToThree {
        servers: _servers,
        new,
        all,
        plan,
        ..
    } = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let client = Client::new(&new).unwrap();
    let key = moving_key(&plan, "family");
    let parent = client
        .enqueue(NewJob::new("moving", "parent", json!({})).ordering_key(key.clone()))
        .await
        .unwrap();
    let m = plan
        .moves
        .iter()
        .find(|m| m.first_key <= parent.shard_key && parent.shard_key < m.end_key)
        .unwrap();
    let (from, to) = (all.get(m.from_index), all.get(2));
    let run = "UPDATE workflow_status SET status = 'running', owner = $3, fence = $4, \
        attempts = 1, started_at = now(), lease_expires_at = now() + interval '1 hour' \
        WHERE shard_key = $1 AND id = $2";
    let db = from.client().await.unwrap();
    db.execute(run, &[&parent.shard_key, &parent.id, &OWNER, &FENCE])
        .await
        .unwrap();
    let child = start_idle_child(from, parent).await;

    // The child is copied; the parent, running, stays; it then finishes
    // there and the move is released.
    let copy = Options {
        stop_after: Some(Step::Copied),
        ..Options::default()
    };
    reshard(&all, 2, 3, &copy, |_| {}).await.unwrap();
    db.execute(
        "UPDATE workflow_status SET status = 'succeeded', owner = NULL, \
            lease_expires_at = NULL, finished_at = now() WHERE shard_key = $1 AND id = $2",
        &[&parent.shard_key, &parent.id],
    )
    .await
    .unwrap();
    let finish = Options {
        patience: Some(Duration::from_secs(30)),
        ..Options::default()
    };
    assert!(reshard(&all, 2, 3, &finish, |_| {}).await.unwrap().complete);
    assert_eq!(children_on(to, parent).await, vec![child.id], "moved");
    assert!(children_on(from, parent).await.is_empty(), "removed");

    let check = CheckOptions::from_config(&new);
    let report = client.check(&check).await;
    assert_eq!(report.violations(), 0, "{report:#?}");
    let judged = report.shards[2].finding(Invariant::ParentMissing).unwrap();
    assert!(judged.scanned >= 1, "the moved child was read: {judged:?}");

    // A parent created on the new shard after the move, its child beside
    // it: its deletion is judged.
    let later = client
        .enqueue(NewJob::new("moving", "parent", json!({})).ordering_key(key))
        .await
        .unwrap();
    let db = to.client().await.unwrap();
    db.execute(run, &[&later.shard_key, &later.id, &OWNER, &FENCE])
        .await
        .unwrap();
    let orphan = start_idle_child(to, later).await;
    db.execute(
        "DELETE FROM workflow_status WHERE shard_key = $1 AND id = $2",
        &[&later.shard_key, &later.id],
    )
    .await
    .unwrap();
    let report = client.check(&check).await;
    assert_eq!(report.broken(Invariant::ParentMissing), 1, "{report:#?}");
    let found = report.shards[2].finding(Invariant::ParentMissing).unwrap();
    assert_eq!(found.examples[0].job, Some(orphan));
}

/// Starts child step 1 of `parent` (held by the test's claim) in a queue
/// no worker serves.
async fn start_idle_child(on: &Shard, parent: JobId) -> JobId {
    let payload = json!({});
    let started = children::start(
        on,
        StartChild {
            parent,
            name: "shardq:child:1",
            owner: OWNER,
            fence: FENCE,
            queue: "idle",
            handler: "child",
            payload: &payload,
            ordering_key: None,
            group: None,
            priority: 0,
            delay: Duration::ZERO,
            max_attempts: 3,
            abandon_on_parent_cancel: false,
            timeout_ms: None,
        },
    )
    .await
    .unwrap();
    let Started::Child(child) = started else {
        panic!("{started:?}")
    };
    child
}

/// A parent's run 1 recorded a child's identity on another shard and
/// inserted the child there, then died before it recorded the start; the
/// child ran and finished; then its key's range moved to a new shard (a
/// move leaves finished rows where they are). Run 2 inserts again where
/// the key routes now: the child's row on its old shard must be found,
/// or the child would run twice; and a cancel's cascade must write no
/// stand-in beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_finished_on_a_shard_its_range_left_is_not_inserted_again() {
    use shardq::store::children_elsewhere::{self as elsewhere, ChildRow};
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let Unstarted {
        parent,
        home,
        child,
        child_key,
        from_index,
    } = unstarted_child(&m).await;
    let (all, home) = (&m.all, m.all.get(home));
    let old_shard = all.get(from_index);
    let at = child.shard_key;
    let payload = json!({});
    let start = StartChild {
        parent,
        name: "shardq:child:1",
        owner: OWNER,
        fence: FENCE,
        queue: "idle",
        handler: "child",
        payload: &payload,
        ordering_key: Some(&child_key),
        group: None,
        priority: 0,
        delay: Duration::ZERO,
        max_attempts: 3,
        abandon_on_parent_cancel: false,
        timeout_ms: None,
    };
    let row = ChildRow {
        id: child,
        parent,
        parent_deadline: None,
        job: &start,
    };
    elsewhere::insert(old_shard, row).await.unwrap();
    // Run 1 dies; the child runs and finishes on its shard.
    old_shard
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET status = 'succeeded', finished_at = now() \
             WHERE shard_key = $1 AND id = $2",
            &[&child.shard_key, &child.id],
        )
        .await
        .unwrap();
    let summary = reshard(all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    all.load_map().await.unwrap();
    assert_eq!(
        all.for_key(at).index,
        2,
        "the child's key routes to the new shard"
    );

    // Run 2: the identity is the earlier run's.
    elsewhere::insert_once(all, row, true).await.unwrap();
    let mut found = Vec::new();
    for shard in all.all() {
        if children_on(shard, parent).await.contains(&child.id) {
            found.push(shard.index);
        }
    }
    assert_eq!(found, vec![from_index], "one child, on its old shard");

    // A cancel of the parent: the cascade finds the child where it is, and
    // writes no stand-in where its key routes now.
    shardq::store::cancel_cascade::cancel_descendants(all, home.index, &[parent])
        .await
        .unwrap();
    let mut found = Vec::new();
    for shard in all.all() {
        if children_on(shard, parent).await.contains(&child.id) {
            found.push(shard.index);
        }
    }
    assert_eq!(found, vec![from_index], "no stand-in beside the child");
}

/// A parent cancelled while the range of its unstarted child's key moves
/// (the child's id reserved on the old shard, its identity recorded, the
/// move's ranges opened): the cascade leaves that child's stand-in out
/// (the move's hold trigger refuses an id from before the move) and
/// answers, instead of failing the cancel, but says it did not reach
/// every child, so its cascade stays owed. Once the move is over, the
/// workers' pass over the cascades owed writes the stand-in on the new
/// shard: the parent's run, inserting the child there after, writes
/// nothing, and the child never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_an_unstarted_childs_range_moves_stays_owed_until_the_move_is_over() {
    use shardq::reshard::Step;
    use shardq::store::cascades_owed;
    use shardq::store::children_elsewhere::{self as elsewhere, ChildRow};
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let Unstarted {
        parent,
        home,
        child,
        child_key,
        ..
    } = unstarted_child(&m).await;
    let all = &m.all;
    let at = child.shard_key;
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(all, 2, 3, &opened, |_| {}).await.unwrap();
    all.load_map().await.unwrap();
    assert_eq!(all.for_key(at).index, 2);

    // The canceller: the parent's cancel, then its cascade.
    let asked = shardq::store::jobs::cancel(all.get(home), parent)
        .await
        .unwrap();
    assert_eq!(asked, Some(shardq::store::JobStatus::Running));
    let cascaded = shardq::store::cancel_cascade::cancel_descendants(all, home, &[parent])
        .await
        .expect("the cascade answers");
    assert!(!cascaded.complete, "the child's stand-in was left out");
    for shard in all.all() {
        assert!(children_on(shard, parent).await.is_empty(), "no stand-in");
    }
    // The workers' pass during the move: the same, and the debt stays.
    let db = all.get(home).client().await.unwrap();
    let due_now = "UPDATE shardq_cascades_owed SET due_at = now()";
    db.execute(due_now, &[]).await.unwrap();
    let pass = cascades_owed::run_due(all, home, 100).await.unwrap();
    assert_eq!((pass.taken, pass.done), (1, 0), "{pass:?}");

    let finish = Options {
        patience: Some(Duration::from_secs(30)),
        ..Options::default()
    };
    assert!(reshard(all, 2, 3, &finish, |_| {}).await.unwrap().complete);
    all.load_map().await.unwrap();
    db.execute(due_now, &[]).await.unwrap();
    let pass = cascades_owed::run_due(all, home, 100).await.unwrap();
    assert_eq!((pass.taken, pass.done), (1, 1), "{pass:?}");

    // The parent's run, still going: its insert of the child.
    let payload = json!({});
    let start = crate::children_across::first_child_of(parent, &child_key, &payload);
    let row = ChildRow {
        id: child,
        parent,
        parent_deadline: None,
        job: &start,
    };
    elsewhere::insert(all.get(2), row).await.unwrap();
    let status: String = all
        .get(2)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT status FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&child.shard_key, &child.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "cancelled", "the stand-in, not the child");
}

/// A parent cancelled while its started child runs on the shard its key's
/// range is leaving (a move copies unclaimed jobs only, so the shard the
/// child's key routes to now has no row of it): the cascade asks the child
/// to cancel where it runs, and says it reached every child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reaches_a_started_child_running_where_its_range_is_moving_from() {
    use shardq::reshard::Step;
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let Unstarted {
        parent,
        home,
        child,
        child_key,
        from_index,
    } = unstarted_child(&m).await;
    let all = &m.all;
    let old_shard = all.get(from_index);
    // Run 1 inserts the child and records its start; a worker claims it.
    start_child_running(all.get(home), old_shard, parent, child, &child_key).await;

    let copied = Options {
        stop_after: Some(Step::Copied),
        ..Options::default()
    };
    reshard(all, 2, 3, &copied, |_| {}).await.unwrap();
    all.load_map().await.unwrap();
    assert_eq!(all.for_key(child.shard_key).index, 2);
    assert!(
        children_on(all.get(2), parent).await.is_empty(),
        "not copied"
    );

    shardq::store::jobs::cancel(all.get(home), parent)
        .await
        .unwrap();
    let cascaded = shardq::store::cancel_cascade::cancel_descendants(all, home, &[parent])
        .await
        .unwrap();
    assert!(cascaded.complete);
    assert_eq!(cascaded.changed, 1, "{cascaded:?}");
    let asked = cancel_asked(old_shard, child).await;
    assert!(asked, "the running child was asked to cancel where it runs");
}

/// The same, with the parent moving too: parked, it is copied to the new
/// shard with its steps, where its child's key now routes as well; the
/// child runs on its old shard. A cancel on the new shard cascades from
/// there: the child, started but with no row where its key routes, is
/// asked to cancel where it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_a_moved_parent_reaches_its_child_running_on_the_old_shard() {
    use shardq::reshard::Step;
    use shardq::store::children_elsewhere::{self as elsewhere, Identity, ParentStep};
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let all = &m.all;
    let client = Client::new(&m.new).unwrap();
    let old = shardq::shard_map::ShardMap::from_formula(2);
    let parent = client
        .enqueue(NewJob::new("idle", "parent", json!({})).ordering_key(moving_key(&m.plan, "home")))
        .await
        .unwrap();
    let parent_shard = all.get(old.shard_for(parent.shard_key));
    let child_key = moving_key(&m.plan, "away");
    let at = shardq::router::shard_key_for(&child_key);
    let child_shard = all.get(old.shard_for(at));
    let db = parent_shard.client().await.unwrap();
    db.execute(
        "UPDATE workflow_status SET status = 'running', owner = $3, fence = $4, attempts = 1, \
            started_at = now(), lease_expires_at = now() + interval '1 hour' \
         WHERE shard_key = $1 AND id = $2",
        &[&parent.shard_key, &parent.id, &OWNER, &FENCE],
    )
    .await
    .unwrap();
    // Its run starts the child (identity, insert, start) and parks.
    let child = JobId {
        shard_key: at,
        id: elsewhere::reserve_id(child_shard, at).await.unwrap(),
    };
    let step = ParentStep {
        parent,
        name: "shardq:child:1",
        owner: OWNER,
        fence: FENCE,
    };
    let named = Identity {
        id: child,
        queue: "idle",
        handler: "child",
    };
    elsewhere::intent(parent_shard, step, named).await.unwrap();
    start_child_running(parent_shard, child_shard, parent, child, &child_key).await;
    db.execute(
        "UPDATE workflow_status SET status = 'scheduled', parked = true, owner = NULL, \
            lease_expires_at = NULL, run_at = now() + interval '1 hour' \
         WHERE shard_key = $1 AND id = $2",
        &[&parent.shard_key, &parent.id],
    )
    .await
    .unwrap();

    let copied = Options {
        stop_after: Some(Step::Copied),
        ..Options::default()
    };
    reshard(all, 2, 3, &copied, |_| {}).await.unwrap();
    all.load_map().await.unwrap();
    let new = all.get(2);
    assert!(
        shardq::store::jobs::exists(new, parent).await.unwrap(),
        "the parent moved"
    );
    assert!(
        !shardq::store::jobs::exists(new, child).await.unwrap(),
        "the child did not"
    );

    assert!(shardq::store::jobs::cancel(new, parent)
        .await
        .unwrap()
        .is_some());
    let cascaded = shardq::store::cancel_cascade::cancel_descendants(all, 2, &[parent])
        .await
        .unwrap();
    assert_eq!(
        (cascaded.changed, cascaded.complete),
        (1, true),
        "{cascaded:?}"
    );
    let asked = cancel_asked(child_shard, child).await;
    assert!(asked, "the running child was asked to cancel where it runs");
}

/// The rest of a parent's start of `child` (its identity recorded on
/// `parent_shard`): the child inserted on `child_shard` (key `child_key`),
/// its start recorded, and the child claimed by a worker there.
async fn start_child_running(
    parent_shard: &Shard,
    child_shard: &Shard,
    parent: JobId,
    child: JobId,
    child_key: &str,
) {
    use shardq::store::children_elsewhere::{self as elsewhere, ChildRow};
    let payload = json!({});
    let start = crate::children_across::first_child_of(parent, child_key, &payload);
    let row = ChildRow {
        id: child,
        parent,
        parent_deadline: None,
        job: &start,
    };
    elsewhere::insert(child_shard, row).await.unwrap();
    let output = json!({"child_shard_key": child.shard_key, "child_id": child.id});
    parent_shard
        .client()
        .await
        .unwrap()
        .execute(
            "INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output) \
             VALUES ($1, $2, 'shardq:child:1', $3)",
            &[&parent.shard_key, &parent.id, &output],
        )
        .await
        .unwrap();
    child_shard
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET status = 'running', owner = 'elsewhere', fence = 1, \
                attempts = 1, started_at = now(), lease_expires_at = now() + interval '1 hour' \
             WHERE shard_key = $1 AND id = $2",
            &[&child.shard_key, &child.id],
        )
        .await
        .unwrap();
}

/// Whether `id`'s cancellation was asked on `shard`.
async fn cancel_asked(shard: &Shard, id: JobId) -> bool {
    shard
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT cancel_requested FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap()
        .get(0)
}

/// A child whose start its parent's run has not recorded: its key in a
/// range the move 2 → 3 gives to the new shard, its id reserved on its old
/// shard (`from_index`), its identity recorded by the parent (running on
/// the other old shard, `home`, claimed by hand).
struct Unstarted {
    parent: JobId,
    home: usize,
    child: JobId,
    child_key: String,
    from_index: usize,
}

async fn unstarted_child(m: &GrowingToThree) -> Unstarted {
    use shardq::store::children_elsewhere::{self as elsewhere, Identity, Intent, ParentStep};
    let client = Client::new(&m.new).unwrap();
    let child_key = moving_key(&m.plan, "away");
    let at = shardq::router::shard_key_for(&child_key);
    let from_index = m
        .plan
        .moves
        .iter()
        .find(|v| v.first_key <= at && at < v.end_key)
        .unwrap()
        .from_index;
    let (parent, home) =
        parent_running_outside_the_move(&client, &m.all, &m.plan, from_index).await;
    let child = JobId {
        shard_key: at,
        id: elsewhere::reserve_id(m.all.get(from_index), at)
            .await
            .unwrap(),
    };
    let step = ParentStep {
        parent,
        name: "shardq:child:1",
        owner: OWNER,
        fence: FENCE,
    };
    let named = Identity {
        id: child,
        queue: "idle",
        handler: "child",
    };
    assert_eq!(
        elsewhere::intent(home, step, named).await.unwrap(),
        Intent::Reserved(child, None)
    );
    Unstarted {
        parent,
        home: home.index,
        child,
        child_key,
        from_index,
    }
}

/// A parent keyed outside every moving range, on the old shard that is
/// not `from_index`, claimed by hand (owner [`OWNER`], fence [`FENCE`]).
async fn parent_running_outside_the_move<'a>(
    client: &Client,
    all: &'a shardq::shards::ShardSet,
    plan: &shardq::reshard::Plan,
    from_index: usize,
) -> (JobId, &'a Shard) {
    let old = shardq::shard_map::ShardMap::from_formula(2);
    let parent_key = (0..)
        .map(|i| format!("home-{i}"))
        .find(|k| {
            let sk = shardq::router::shard_key_for(k);
            old.shard_for(sk) != from_index
                && !plan
                    .moves
                    .iter()
                    .any(|m| m.first_key <= sk && sk < m.end_key)
        })
        .unwrap();
    let parent = client
        .enqueue(NewJob::new("idle", "parent", json!({})).ordering_key(parent_key))
        .await
        .unwrap();
    let home = all.get(1 - from_index);
    home.client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET status = 'running', owner = $3, fence = $4, attempts = 1, \
                started_at = now(), lease_expires_at = now() + interval '1 hour' \
             WHERE shard_key = $1 AND id = $2",
            &[&parent.shard_key, &parent.id, &OWNER, &FENCE],
        )
        .await
        .unwrap();
    (parent, home)
}

/// A child's wake owed to a parent whose key's range is moving waits for
/// the move's release by design (`shardq_wake_parent` leaves it): `shardq
/// check` does not report it as a wake not relayed, however old, while
/// the move runs; a wake owed to a parent whose range stays is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_owed_to_a_parent_whose_range_moves_is_not_reported_stuck() {
    use shardq::client::{CheckOptions, Invariant};
    use shardq::reshard::Step;
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let moving = shardq::router::shard_key_for(&moving_key(&m.plan, "parent"));
    let from_index = m
        .plan
        .moves
        .iter()
        .find(|v| v.first_key <= moving && moving < v.end_key)
        .unwrap()
        .from_index;
    let old = shardq::shard_map::ShardMap::from_formula(2);
    let staying = (0..)
        .map(|i| shardq::router::shard_key_for(&format!("stay-{i}")))
        .find(|&k| {
            old.shard_for(k) == from_index
                && !m
                    .plan
                    .moves
                    .iter()
                    .any(|v| v.first_key <= k && k < v.end_key)
        })
        .unwrap();
    // Children on the other old shard, finished two minutes ago, owing
    // wakes to parents on `from_index`: one in the moving range, one not.
    let child_key = (0..)
        .map(|i| shardq::router::shard_key_for(&format!("child-{i}")))
        .find(|&k| {
            old.shard_for(k) != from_index
                && !m
                    .plan
                    .moves
                    .iter()
                    .any(|v| v.first_key <= k && k < v.end_key)
        })
        .unwrap();
    m.all
        .get(1 - from_index)
        .client()
        .await
        .unwrap()
        .execute(
            "INSERT INTO workflow_status (shard_key, queue, handler, status, finished_at, \
                parent_shard_key, parent_id, parent_wake) \
             VALUES ($1, 'idle', 'x', 'succeeded', now() - interval '2 minutes', $2, 1, true), \
                    ($1, 'idle', 'x', 'succeeded', now() - interval '2 minutes', $3, 2, true)",
            &[&child_key, &moving, &staying],
        )
        .await
        .unwrap();
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &opened, |_| {}).await.unwrap();

    let client = Client::new(&m.new).unwrap();
    let report = client.check(&CheckOptions::from_config(&m.new)).await;
    assert_eq!(
        report.broken_invariants(),
        vec![Invariant::WakeNotRelayed],
        "{report:#?}"
    );
    let finding = report.shards[1 - from_index]
        .finding(Invariant::WakeNotRelayed)
        .unwrap();
    assert_eq!(finding.broken, 1, "only the staying parent's: {report:#?}");
    assert!(
        finding.examples[0].detail.contains(&format!("{staying}-2")),
        "{report:#?}"
    );
}
