//! A shard that stops answering at tick time (its server SIGSTOPped for 4 s,
//! as a hung host looks) while two workers run two per-second schedules, one
//! living on each shard. The frozen shard's ticks are retried and enqueued
//! once it answers again, each exactly once (statements sent during the
//! freeze run when it thaws, after their sender gave up: lost replies); the
//! other schedule keeps ticking on time meanwhile.

use crate::common;

use chrono::{DateTime, TimeDelta, Utc};
use common::TestShards;
use nix::sys::signal::Signal;
use shardq::shards::ShardSet;
use shardq::{router, HandlerRegistry, Schedule, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const WORKER: &str = "
[dequeue]
statement_timeout_ms = 1000
connect_timeout_ms = 1000
[worker]
queues = [\"nobody\"]
";

const FREEZE: Duration = Duration::from_secs(4);

/// A per-second schedule whose name routes to shard `index` of 2.
fn living_on(index: usize) -> Schedule {
    let name = (0..)
        .map(|i| format!("tick-{i}"))
        .find(|n| router::shard_index(router::shard_key_for(n), 2) == index)
        .unwrap();
    Schedule::new(name, "* * * * * *", "ticks", "noop").unwrap()
}

/// (tick, created_at) of every job of `schedule`, by tick; panics on a double.
async fn jobs_of(set: &ShardSet, schedule: &Schedule) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    let db = set.for_key(schedule.shard_key()).client().await.unwrap();
    let rows = db
        .query(
            "SELECT dedup_id, count(*), min(created_at) FROM workflow_status \
             WHERE dedup_id LIKE $1 || '@%' GROUP BY 1",
            &[&schedule.name()],
        )
        .await
        .unwrap();
    let mut jobs: Vec<_> = rows
        .iter()
        .map(|row| {
            let id: String = row.get(0);
            assert_eq!(row.get::<_, i64>(1), 1, "tick {id} enqueued twice");
            let tick = DateTime::parse_from_rfc3339(id.split_once('@').unwrap().1).unwrap();
            (tick.to_utc(), row.get(2))
        })
        .collect();
    jobs.sort();
    jobs
}

fn assert_contiguous(jobs: &[(DateTime<Utc>, DateTime<Utc>)], what: &str) {
    for pair in jobs.windows(2) {
        assert_eq!(
            pair[1].0 - pair[0].0,
            TimeDelta::seconds(1),
            "{what}: tick lost between {} and {}",
            pair[0].0,
            pair[1].0
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_shards_ticks_come_late_once_and_the_other_shard_keeps_time() {
    let shards = TestShards::servers(2).await;
    let config = shards.config(WORKER);
    let set = shards.migrated(&config).await;
    let (on_healthy, on_frozen) = (living_on(0), living_on(1));

    let stop = CancellationToken::new();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let worker = Worker::new(
            config.clone(),
            set.clone(),
            HandlerRegistry::with_builtins(),
        )
        .schedule(on_healthy.clone())
        .unwrap()
        .schedule(on_frozen.clone())
        .unwrap();
        workers.spawn(worker.run(stop.clone()));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let frozen = shards.servers[1].server();
    frozen.signal_all(Signal::SIGSTOP).unwrap();
    let froze_at = Utc::now();
    tokio::time::sleep(FREEZE).await;
    frozen.signal_all(Signal::SIGCONT).unwrap();
    let thawed_at = Utc::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.cancel();
    while let Some(done) = workers.join_next().await {
        done.unwrap();
    }

    let late = jobs_of(&set, &on_frozen).await;
    let healthy = jobs_of(&set, &on_healthy).await;
    assert_contiguous(&late, "frozen shard's schedule");
    assert_contiguous(&healthy, "healthy shard's schedule");
    let during = |jobs: &[(DateTime<Utc>, DateTime<Utc>)]| {
        jobs.iter()
            .filter(|(tick, _)| *tick > froze_at && *tick < thawed_at)
            .copied()
            .collect::<Vec<_>>()
    };
    let frozen_ticks = during(&late);
    println!(
        "frozen {froze_at} .. {thawed_at}: its schedule's ticks then: {:?}",
        frozen_ticks
            .iter()
            .map(|(t, created)| (t.to_string(), (*created - *t).num_milliseconds()))
            .collect::<Vec<_>>()
    );
    assert!(
        frozen_ticks.len() >= 3,
        "ticks of the freeze: {frozen_ticks:?}"
    );
    assert!(
        frozen_ticks
            .iter()
            .all(|(_, created)| *created >= thawed_at - TimeDelta::milliseconds(100)),
        "the frozen shard wrote nothing while frozen: {frozen_ticks:?}"
    );
    assert!(late.last().unwrap().0 > thawed_at + TimeDelta::seconds(2));
    // The other shard's schedule did not wait for the frozen one.
    let on_time = during(&healthy)
        .into_iter()
        .filter(|(_, created)| *created < thawed_at)
        .count();
    assert!(
        on_time >= 3,
        "healthy ticks enqueued during the freeze: {on_time}"
    );
}
