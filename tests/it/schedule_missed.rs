//! Ticks missed while no worker ran: a yearly schedule (January 1st, 00:00
//! UTC) whose `last_tick` is set years in the past, then a worker (embedded,
//! the schedule given in code) starts. With `skip` it enqueues nothing and
//! moves `last_tick` to the latest missed tick; with `run_once` three
//! workers starting at once enqueue exactly one job, for that tick. A schedule no process has seen before
//! enqueues nothing for its earlier ticks.

use crate::common;

use chrono::{DateTime, TimeZone, Utc};
use common::{wait_until, TestShards};
use shardq::schedule::due::LATE_TICK_GRACE;
use shardq::shards::{Shard, ShardSet};
use shardq::store::schedules;
use shardq::{Config, HandlerRegistry, Missed, Schedule, ScheduleError, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const NAME: &str = "new-year";

/// Its queue is one no worker here serves, so its jobs stay to be counted.
fn yearly(missed: Missed) -> Schedule {
    Schedule::new(NAME, "0 0 1 1 *", "greetings", "noop")
        .unwrap()
        .missed(missed)
}

/// Runs `workers` workers with `schedule` at once until `last_tick` of
/// `NAME` is `until`.
async fn run_until(
    config: &Config,
    set: &ShardSet,
    schedule: Schedule,
    until: DateTime<Utc>,
    workers: usize,
) {
    let shutdown = CancellationToken::new();
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let worker = Worker::new(
            config.clone(),
            set.clone(),
            HandlerRegistry::with_builtins(),
        )
        .schedule(schedule.clone())
        .unwrap();
        running.spawn(worker.run(shutdown.clone()));
    }
    let home = home(set);
    wait_until(Duration::from_secs(20), "last_tick moves", || async move {
        let last = schedules::last_tick(home, NAME).await.unwrap();
        last.map(|l| l.at) == Some(until)
    })
    .await;
    shutdown.cancel();
    while let Some(done) = running.join_next().await {
        done.unwrap();
    }
}

fn home(set: &ShardSet) -> &Shard {
    set.for_key(shardq::router::shard_key_for(NAME))
}

/// The jobs of the schedule, as their deduplication ids.
async fn jobs(set: &ShardSet) -> Vec<String> {
    let mut ids = Vec::new();
    for shard in set.all() {
        let db = shard.client().await.unwrap();
        for row in db
            .query(
                "SELECT dedup_id FROM workflow_status WHERE dedup_id LIKE 'new-year@%'",
                &[],
            )
            .await
            .unwrap()
        {
            ids.push(row.get(0));
        }
    }
    ids
}

/// Two shards, migrated, the schedule recorded with a last tick 3 years back.
async fn long_down() -> (TestShards, Config, ShardSet, DateTime<Utc>) {
    let shards = TestShards::databases(2).await;
    let config = shards.config("[worker]\nqueues = [\"other\"]\n");
    let set = shards.migrated(&config).await;
    let years_ago = Utc.with_ymd_and_hms(2023, 1, 1, 0, 0, 0).unwrap();
    let earlier = years_ago.min(Utc::now() - chrono::TimeDelta::days(3 * 366));
    assert!(schedules::register(home(&set), NAME, earlier)
        .await
        .unwrap());
    let latest_missed = yearly(Missed::Skip)
        .latest_at_or_before(Utc::now() - LATE_TICK_GRACE)
        .unwrap();
    (shards, config, set, latest_missed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_enqueues_nothing_for_the_missed_ticks() {
    let (_servers, config, set, latest_missed) = long_down().await;
    run_until(&config, &set, yearly(Missed::Skip), latest_missed, 1).await;
    assert_eq!(jobs(&set).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_enqueues_one_job_for_the_missed_period() {
    let (_servers, config, set, latest_missed) = long_down().await;
    // Three workers come back at once; one job for the whole period.
    run_until(&config, &set, yearly(Missed::RunOnce), latest_missed, 3).await;
    let schedule = yearly(Missed::RunOnce);
    assert_eq!(jobs(&set).await, vec![schedule.dedup_id(latest_missed)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_schedule_starts_from_now_without_a_backlog() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("[worker]\nqueues = [\"other\"]\n");
    let set = shards.migrated(&config).await;
    let latest = yearly(Missed::RunOnce)
        .latest_at_or_before(Utc::now())
        .unwrap();
    run_until(&config, &set, yearly(Missed::RunOnce), latest, 1).await;
    assert_eq!(jobs(&set).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_a_second_schedule_of_the_same_name() {
    let shards = TestShards::databases(1).await;
    let config = shards.config(
        "[[schedules]]\nname = \"new-year\"\ncron = \"@yearly\"\nqueue = \"q\"\nhandler = \"noop\"\n",
    );
    let set = shardq::shards::ShardSet::connect(&config).unwrap();
    let err = Worker::new(config, set, HandlerRegistry::with_builtins())
        .schedule(yearly(Missed::Skip))
        .err()
        .expect("a duplicate is refused");
    assert!(
        matches!(err, ScheduleError::Duplicate(ref n) if n == NAME),
        "{err}"
    );
    assert!(err.to_string().contains("unique name"), "{err}");
}
