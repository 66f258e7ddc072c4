//! Ticks are judged by the database's clock, not the worker's: a worker whose
//! clock runs five minutes ahead, with `missed = "skip"`, enqueues each tick
//! of a per-second schedule once it has happened by the database's clock, and
//! never moves `last_tick` past a tick that has not happened yet there (its
//! own clock would call the next four minutes "missed" and skip them). The
//! tick statement itself refuses a tick in the future, and a skip of a tick
//! not yet older than the grace.

use crate::common;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use common::{wait_until, TestShards};
use shardq::schedule::due::LATE_TICK_GRACE;
use shardq::shards::{Shard, ShardSet};
use shardq::store::schedules::{self, Tick};
use shardq::{HandlerRegistry, Missed, Schedule, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const NAME: &str = "every-second";
/// How far the worker's clock runs ahead: well past the 60 s grace.
const AHEAD: TimeDelta = TimeDelta::minutes(5);
/// Ticks to see enqueued before the run stops.
const TICKS: usize = 3;

/// Its queue is one no worker here serves, so its jobs stay to be read.
fn per_second() -> Schedule {
    Schedule::new(NAME, "* * * * * *", "ticks", "noop")
        .unwrap()
        .missed(Missed::Skip)
}

fn home(set: &ShardSet) -> &Shard {
    set.for_key(shardq::router::shard_key_for(NAME))
}

/// The database's clock.
async fn db_now(shard: &Shard) -> DateTime<Utc> {
    schedules::clock(shard).await.unwrap()
}

/// The ticks whose jobs were enqueued, oldest first.
async fn enqueued(shard: &Shard) -> Vec<DateTime<Utc>> {
    let db = shard.client().await.unwrap();
    let rows = db
        .query(
            "SELECT dedup_id FROM workflow_status WHERE queue = 'ticks' ORDER BY dedup_id",
            &[],
        )
        .await
        .unwrap();
    let schedule = per_second();
    let mut ticks: Vec<DateTime<Utc>> = rows
        .iter()
        .map(|r| {
            let id: String = r.get(0);
            let at = id.strip_prefix(&format!("{NAME}@")).expect("a tick's id");
            let at = DateTime::parse_from_rfc3339(at)
                .unwrap()
                .with_timezone(&Utc);
            assert_eq!(schedule.dedup_id(at), id);
            at
        })
        .collect();
    ticks.sort();
    ticks
}

async fn one_shard() -> (TestShards, shardq::Config, ShardSet) {
    let shards = TestShards::databases(1).await;
    let config = shards.config("[worker]\nqueues = [\"other\"]\n");
    let set = shards.migrated(&config).await;
    (shards, config, set)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_clock_ahead_skips_no_tick_that_has_not_happened_yet() {
    let (_servers, config, set) = one_shard().await;
    let shard = home(&set);
    let start = db_now(shard)
        .await
        .duration_trunc(TimeDelta::seconds(1))
        .unwrap();
    assert!(schedules::register(shard, NAME, start).await.unwrap());

    let shutdown = CancellationToken::new();
    let worker = Worker::new(
        config.clone(),
        set.clone(),
        HandlerRegistry::with_builtins(),
    )
    .scheduler_clock_ahead(AHEAD)
    .schedule(per_second())
    .unwrap();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_until(Duration::from_secs(30), "ticks are enqueued", || async {
        let last = schedules::last_tick(shard, NAME).await.unwrap().unwrap().at;
        // Checked while it runs: never past the database's now.
        let now = db_now(shard).await;
        assert!(
            last <= now,
            "last_tick {last} is ahead of the database's clock {now}"
        );
        enqueued(shard).await.len() >= TICKS
    })
    .await;
    shutdown.cancel();
    running.await.unwrap();

    let last = schedules::last_tick(shard, NAME).await.unwrap().unwrap().at;
    let now = db_now(shard).await;
    assert!(
        last <= now,
        "last_tick {last} is ahead of the database's clock {now}"
    );
    // Every second from the start on, none skipped, none early.
    let ticks = enqueued(shard).await;
    let expected: Vec<DateTime<Utc>> = (1..=ticks.len() as i64)
        .map(|s| start + TimeDelta::seconds(s))
        .collect();
    assert_eq!(ticks, expected, "every tick since the start, in order");
    assert_eq!(ticks.last(), Some(&last));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tick_statement_refuses_a_tick_not_ripe_by_the_database_clock() {
    let (_servers, _config, set) = one_shard().await;
    let shard = home(&set);
    let now = db_now(shard)
        .await
        .duration_trunc(TimeDelta::seconds(1))
        .unwrap();
    let registered = now - TimeDelta::hours(1);
    assert!(schedules::register(shard, NAME, registered).await.unwrap());
    let schedule = per_second();
    let tick = |at: DateTime<Utc>, enqueue: bool| {
        let job = schedule.job_for(at);
        let shard_key = schedule.shard_key();
        async move {
            let tick = Tick {
                name: NAME,
                at,
                shard_key,
                job: &job,
                max_attempts: 3,
                enqueue,
            };
            schedules::tick(shard, tick).await.unwrap()
        }
    };
    // A tick in the future (a clock ahead) is neither enqueued nor recorded.
    let early = tick(now + AHEAD, true).await;
    assert!(
        early.not_yet && !early.advanced && early.job.is_none(),
        "{early:?}"
    );
    // A skip of a tick within the grace is refused too: it is not missed yet.
    let recent = now - LATE_TICK_GRACE / 2;
    let skip = tick(recent, false).await;
    assert!(skip.not_yet && !skip.advanced, "{skip:?}");
    let last = schedules::last_tick(shard, NAME).await.unwrap().unwrap();
    assert_eq!(last.at, registered, "nothing recorded");
    assert!(enqueued(shard).await.is_empty());

    // Ripe ticks go through: a skip older than the grace, then a tick now.
    let missed = now - LATE_TICK_GRACE * 2;
    let skipped = tick(missed, false).await;
    assert!(
        !skipped.not_yet && skipped.advanced && skipped.job.is_none(),
        "{skipped:?}"
    );
    let on_time = tick(now, true).await;
    assert!(
        !on_time.not_yet && on_time.advanced && on_time.job.is_some(),
        "{on_time:?}"
    );
    assert_eq!(enqueued(shard).await, vec![now]);
}
