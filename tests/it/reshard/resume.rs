//! A move stopped or killed part way, then run again: it finishes, copies
//! each job once, and refuses a list that is not the one it began with.

use crate::common;

use super::{growing_to_three, moving_key, statuses, GrowingToThree, WORKER_TOML};
use common::{ShardList, TestShards};
use serde_json::json;
use shardq::reshard::{reshard, Options, Step};
use shardq::shards::ShardSet;
use shardq::{
    Client, ClientError, Config, HandlerRegistry, JobId, JobStatus, NewJob, OnDuplicate, Worker,
};
use std::collections::HashMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The command stopped after each step and run again: while a range is
/// recorded but not yet open (the command died in between), an enqueue of
/// it waits (SQ005, tried again) and writes nothing; once open, it is
/// written held, and a client with the
/// old map is fenced, reloads and writes the job held on the new shard; the
/// copy leaves the old shard no unclaimed job of the range; the last run
/// releases everything, and a worker runs every job once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_stopped_at_each_step_finishes_when_run_again() {
    let GrowingToThree {
        servers: _servers,
        new,
        all,
        plan,
        ..
    } = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let key = moving_key(&plan, "mover");
    let dedup = moving_key(&plan, "order");
    let once = || {
        NewJob::new("moving", "noop", json!({}))
            .dedup(dedup.clone(), OnDuplicate::Error)
            .delay(Duration::from_millis(500))
    };
    // Loaded at epoch 1, before the move: stale from here on.
    let stale = Client::new(&new).unwrap();
    let mut jobs: Vec<NewJob> = (0..300)
        .map(|i| NewJob::new("moving", "noop", json!({ "i": i })))
        .collect();
    let in_order =
        |r: i64| NewJob::new("moving", "noop", json!({ "revision": r })).ordering_key(key.clone());
    jobs.extend((0..5).map(in_order));
    jobs.push(once());
    let first = stale.enqueue_many(jobs).await.unwrap();

    let step = |s| Options {
        stop_after: Some(s),
        ..Options::default()
    };
    reshard(&all, 2, 3, &step(Step::Recorded), |_| {})
        .await
        .unwrap();
    // An enqueue into the range waits for the move to open it (a running
    // move does within seconds of recording), writing nothing until then.
    let waiting = Client::new(&new).unwrap();
    let waited = tokio::spawn({
        let job =
            NewJob::new("moving", "noop", json!({ "waited": true })).ordering_key(key.clone());
        async move { waiting.enqueue(job).await }
    });
    // Longer than the client's retries of other errors (5 tries, about
    // 2 s of pauses).
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!waited.is_finished(), "it waits while the range is closed");
    let total: i64 = futures_util::future::join_all(all.all().iter().map(statuses))
        .await
        .iter()
        .flat_map(|m| m.values())
        .sum();
    assert_eq!(
        total,
        first.len() as i64,
        "the waiting enqueue wrote nothing yet"
    );

    reshard(&all, 2, 3, &step(Step::Opened), |_| {})
        .await
        .unwrap();
    let waited = waited
        .await
        .unwrap()
        .expect("written once its range opened");
    assert_eq!(
        stale.job(waited).await.unwrap().unwrap().status,
        JobStatus::Held
    );
    let held = stale
        .enqueue(in_order(5))
        .await
        .expect("fenced, reloaded, written on the new shard");
    assert_eq!(stale.shards().routing().get().epoch(), 2);
    let info = stale.job(held).await.unwrap().unwrap();
    assert_eq!(info.status, JobStatus::Held);
    // Its range is open, its jobs not yet copied: the deduplication ids
    // were, before the range opened.
    match stale.enqueue(once()).await {
        Err(ClientError::Duplicate { .. }) => {}
        other => panic!("{dedup} admitted twice while its range moves: {other:?}"),
    }

    reshard(&all, 2, 3, &step(Step::Copied), |_| {})
        .await
        .unwrap();
    let on_new = statuses(all.get(2)).await;
    assert!(
        on_new.get("held").copied().unwrap_or(0) > 6,
        "copied jobs wait held: {on_new:?}"
    );
    assert_eq!(
        on_new.len(),
        1,
        "nothing but held jobs on the new shard: {on_new:?}"
    );
    for m in &plan.moves {
        let left = shardq::store::reshard::left(all.get(m.from_index), (m.first_key, m.end_key))
            .await
            .unwrap();
        assert_eq!(left, 0, "the old shard keeps no unclaimed job of {m:?}");
    }

    let summary = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    let again = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(again.ranges, 0, "a finished move has nothing left to do");

    let report = Worker::new(new.clone(), all.clone(), HandlerRegistry::with_builtins())
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    assert_eq!(report.stats.succeeded as usize, first.len() + 2);
    assert_eq!(
        futures_util::future::join_all(all.all().iter().map(statuses))
            .await
            .iter()
            .flat_map(|m| m.iter())
            .filter(|(status, _)| status.as_str() != "succeeded")
            .count(),
        0,
        "every job succeeded"
    );
}

/// A job copied to its new shard whose old row was not yet removed (the
/// command stopped between the two), then cancelled (the cancel finds the
/// copy, on the shard its key routes to): the next run copies the job again
/// and must keep the cancel; the job never runs. Before, the new copy
/// replaced the cancelled one and the job ran after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_a_copy_survives_the_copy_being_made_again() {
    let GrowingToThree {
        servers: _servers,
        new,
        all,
        plan,
        ..
    } = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let key = moving_key(&plan, "victim");
    let client = Client::new(&new).unwrap();
    let victim = client
        .enqueue(NewJob::new("moving", "noop", json!({})).ordering_key(key))
        .await
        .unwrap();
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&all, 2, 3, &opened, |_| {}).await.unwrap();

    // The copy, as the drain makes it, stopped before the removal.
    let m = plan
        .moves
        .iter()
        .find(|m| m.first_key <= victim.shard_key && victim.shard_key < m.end_key)
        .unwrap();
    let (from, to) = (all.get(m.from_index), all.get(2));
    let chunk = (victim.shard_key, victim.shard_key + 1);
    use shardq::store::reshard as store;
    store::mark_held(from, chunk).await.unwrap();
    let held = store::read_held(from, chunk, 0, 10_000).await.unwrap();
    store::write_copies(to, &held, &json!([])).await.unwrap();
    // The cancel as a client with the new map makes it: on the copy, on
    // the shard the key routes to now; the old row is not asked.
    assert_eq!(
        shardq::store::jobs::cancel(to, victim).await.unwrap(),
        Some(JobStatus::Held)
    );

    let summary = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    Worker::new(new.clone(), all.clone(), HandlerRegistry::with_builtins())
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    let info = client.job(victim).await.unwrap().expect("the job");
    assert_eq!(info.status, JobStatus::Cancelled, "the cancel was kept");
}

/// A move to four shards stopped after recording its epoch on its first
/// new shard only (the command was killed there), then a command with a
/// list of three: it must not record another map under the same epoch
/// (shards 0 and 1 would route by one map, shard 2 by the other); it is
/// refused, saying which move to finish, and the first list finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_recorded_in_part_refuses_another_list_until_it_is_finished() {
    let servers = TestShards::databases(4).await;
    let config = |n: usize| {
        Config::from_toml(
            &ShardList::numbered(&servers.urls[..n])
                .pool_size(12)
                .toml(WORKER_TOML),
        )
        .unwrap()
    };
    shardq::migrate::migrate_all(&ShardSet::connect(&config(2)).unwrap())
        .await
        .unwrap();
    let four = ShardSet::connect(&config(4)).unwrap();
    for i in [2, 3] {
        shardq::migrate::migrate_joining(four.get(i), 4)
            .await
            .unwrap();
    }
    let from = shardq::shard_map::ShardMap::from_formula(2);
    let plan = shardq::reshard::plan(from.ranges(), 4);
    let history = shardq::store::reshard::history(four.get(0)).await.unwrap();
    let record = plan.record(2, 4);
    // What the command writes on its first shard before anything else.
    shardq::store::reshard::record_epoch(
        four.get(2),
        &shardq::store::reshard::EpochWrite {
            record: &record,
            history: Some(&history),
            moving_in: true,
            ids_from: 1 << 40,
            in_list: true,
        },
    )
    .await
    .unwrap();

    let three = ShardSet::connect(&config(3)).unwrap();
    let refused = reshard(&three, 2, 3, &Options::default(), |_| {})
        .await
        .expect_err("another list while a move is recorded in part");
    assert!(
        refused.to_string().contains("list of 4 shards (epoch 2)"),
        "{refused}"
    );
    for i in 0..2 {
        let epochs = shardq::store::reshard::history(three.get(i)).await.unwrap();
        assert_eq!(epochs.len(), 1, "nothing recorded on shard {i}");
    }

    let summary = reshard(&four, 2, 4, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    let map = four.load_map().await.expect("one map on every shard");
    assert_eq!((map.epoch(), map.ranges()), (2, &plan.ranges[..]));
}

/// The command killed after marking a chunk held on the old shard (nothing
/// copied), and after copying another chunk without removing it from the
/// old shard: run again, it copies each job once and removes it once; a
/// key with more jobs than a chunk (copied in pieces) keeps its ids and its
/// order; a worker then runs every job once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_killed_between_mark_copy_and_removal_copies_each_job_once() {
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let client = Client::new(&m.new).unwrap();
    let keyed = |name: &str, n: usize| -> Vec<NewJob> {
        let key = moving_key(&m.plan, name);
        (0..n)
            .map(|i| NewJob::new("moving", "noop", json!({ "i": i })).ordering_key(key.clone()))
            .collect()
    };
    let marked = client.enqueue_many(keyed("marked", 30)).await.unwrap();
    let unremoved = client.enqueue_many(keyed("copied", 30)).await.unwrap();
    let big = client.enqueue_many(keyed("big", 2_100)).await.unwrap();
    let opened = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    reshard(&m.all, 2, 3, &opened, |_| {}).await.unwrap();
    use shardq::store::reshard as store;
    let one_key = |id: JobId| (id.shard_key, id.shard_key + 1);
    let from_of = |id: JobId| m.all.get(usize::from(id.shard_key >= 32_768));
    store::mark_held(from_of(marked[0]), one_key(marked[0]))
        .await
        .unwrap();
    let from = from_of(unremoved[0]);
    store::mark_held(from, one_key(unremoved[0])).await.unwrap();
    let held = store::read_held(from, one_key(unremoved[0]), 0, 10_000)
        .await
        .unwrap();
    store::write_copies(m.all.get(2), &held, &json!([]))
        .await
        .unwrap();

    let summary = reshard(&m.all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    let mut rows: HashMap<(i32, i64), Vec<(usize, String)>> = HashMap::new();
    for shard in m.all.all() {
        let db = shard.client().await.unwrap();
        for r in db
            .query("SELECT shard_key, id, status FROM workflow_status", &[])
            .await
            .unwrap()
        {
            let at = (r.get::<_, i32>(0), r.get::<_, i64>(1));
            rows.entry(at).or_default().push((shard.index, r.get(2)));
        }
    }
    for id in marked.iter().chain(&unremoved).chain(&big) {
        let at = rows
            .get(&(id.shard_key, id.id))
            .cloned()
            .unwrap_or_default();
        assert_eq!(at.len(), 1, "job {id} once, on its new shard: {at:?}");
        assert_eq!(at[0].0, 2, "job {id} on its new shard");
    }
    let released = big
        .iter()
        .filter(|id| rows[&(id.shard_key, id.id)][0].1 == "queued")
        .count();
    assert_eq!(
        released,
        big.len(),
        "the big key's jobs released as they were"
    );

    let report = Worker::new(
        m.new.clone(),
        m.all.clone(),
        HandlerRegistry::with_builtins(),
    )
    .stop_when_empty(true)
    .run(CancellationToken::new())
    .await;
    assert_eq!(report.stats.succeeded as usize, 30 + 30 + 2_100);
}

/// A move to three shards stopped after its epoch was recorded everywhere,
/// then run with a list whose third shard is another server: resuming would
/// copy the rest of the range there while the jobs already moved stay held
/// on the first one. It is refused, naming the shard; the list the move
/// began with finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_resumed_with_another_server_as_its_target_is_refused() {
    let servers = TestShards::databases(4).await;
    let list = |urls: &[&String]| {
        let urls: Vec<String> = urls.iter().map(|u| (*u).clone()).collect();
        Config::from_toml(&ShardList::numbered(&urls).pool_size(12).toml(WORKER_TOML)).unwrap()
    };
    let u = &servers.urls;
    shardq::migrate::migrate_all(&ShardSet::connect(&list(&[&u[0], &u[1]])).unwrap())
        .await
        .unwrap();
    let began = ShardSet::connect(&list(&[&u[0], &u[1], &u[2]])).unwrap();
    let swapped = ShardSet::connect(&list(&[&u[0], &u[1], &u[3]])).unwrap();
    for set in [&began, &swapped] {
        shardq::migrate::migrate_joining(set.get(2), 3)
            .await
            .unwrap();
    }
    let recorded = Options {
        stop_after: Some(Step::Recorded),
        ..Options::default()
    };
    reshard(&began, 2, 3, &recorded, |_| {}).await.unwrap();

    let refused = reshard(&swapped, 2, 3, &Options::default(), |_| {})
        .await
        .expect_err("another server in the target's place");
    assert!(
        refused
            .to_string()
            .contains("is not the shard the unfinished move"),
        "{refused}"
    );
    let summary = reshard(&began, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
}
