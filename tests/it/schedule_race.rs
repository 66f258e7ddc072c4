//! The tick statement, driven step by step on two connections: two
//! processes racing for one tick enqueue it once; a tick whose job already
//! finished is not enqueued again (the deduplication index alone would let
//! it); a process killed inside its tick transaction leaves nothing, and the
//! next one enqueues the tick; a process whose clock is behind, trying a tick
//! older than the recorded one, enqueues nothing.

use crate::common;

use chrono::{DateTime, TimeZone, Utc};
use common::{wait_until, TestShards};
use shardq::shards::Shard;
use shardq::store::schedules::{self, Tick, TickOutcome};
use shardq::Schedule;
use std::time::Duration;

const NAME: &str = "race";

fn schedule() -> Schedule {
    Schedule::new(NAME, "* * * * *", "ticks", "noop").unwrap()
}

fn minute(m: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 6, 1, 10, m, 0).unwrap()
}

/// Runs one tick of [`schedule`] at `at` on `client` (a connection or a
/// transaction of the test's).
async fn tick_on<C: tokio_postgres::GenericClient>(client: &C, at: DateTime<Utc>) -> TickOutcome {
    let s = schedule();
    let job = s.job_for(at);
    let tick = Tick {
        name: NAME,
        at,
        shard_key: s.shard_key(),
        job: &job,
        max_attempts: 3,
        enqueue: true,
    };
    schedules::tick_in(client, tick).await.unwrap()
}

/// Jobs of the tick at `at`, finished or not.
async fn jobs_of(shard: &Shard, at: DateTime<Utc>) -> i64 {
    let db = shard.client().await.unwrap();
    let row = db
        .query_one(
            "SELECT count(*) FROM workflow_status WHERE dedup_id = $1",
            &[&schedule().dedup_id(at)],
        )
        .await
        .unwrap();
    row.get(0)
}

async fn one_registered_shard() -> (TestShards, shardq::shards::ShardSet) {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    assert!(schedules::register(set.get(0), NAME, minute(0))
        .await
        .unwrap());
    assert!(
        !schedules::register(set.get(0), NAME, minute(5))
            .await
            .unwrap(),
        "a second registration changes nothing"
    );
    (shards, set)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_racing_for_one_tick_enqueue_it_once() {
    let (_servers, set) = one_registered_shard().await;
    let shard = set.get(0).clone();

    let mut a = shard.user_client().await.unwrap();
    let a_tx = a.transaction().await.unwrap();
    let first = tick_on(&*a_tx, minute(1)).await;
    assert!(first.advanced && first.job.is_some(), "{first:?}");

    // B runs the same tick while A's transaction is open: it waits on the row.
    let b = tokio::spawn({
        let shard = shard.clone();
        async move {
            let mut b = shard.user_client().await.unwrap();
            let b_tx = b.transaction().await.unwrap();
            let outcome = tick_on(&*b_tx, minute(1)).await;
            b_tx.commit().await.unwrap();
            outcome
        }
    });
    let watcher = shard.client().await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "B waits on A's row lock",
        || async {
            let row = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE '%shardq_schedules%'",
                    &[],
                )
                .await
                .unwrap();
            row.get::<_, i64>(0) == 1
        },
    )
    .await;
    assert!(!b.is_finished());
    a_tx.commit().await.unwrap();

    let second = b.await.unwrap();
    assert_eq!(
        second,
        TickOutcome {
            not_yet: false,
            advanced: false,
            job: None,
            moved: false,
        },
        "the second process enqueues nothing"
    );
    assert_eq!(jobs_of(&shard, minute(1)).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_whose_job_finished_is_not_enqueued_again() {
    let (_servers, set) = one_registered_shard().await;
    let shard = set.get(0);
    let db = shard.user_client().await.unwrap();
    assert!(tick_on(&**db, minute(1)).await.job.is_some());
    // The job finishes: the deduplication index no longer covers it.
    db.execute(
        "UPDATE workflow_status SET status = 'succeeded', finished_at = now() WHERE dedup_id = $1",
        &[&schedule().dedup_id(minute(1))],
    )
    .await
    .unwrap();
    let late = tick_on(&**db, minute(1)).await;
    assert_eq!(
        late,
        TickOutcome {
            not_yet: false,
            advanced: false,
            job: None,
            moved: false,
        }
    );
    assert_eq!(jobs_of(shard, minute(1)).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_inside_its_tick_leaves_the_tick_to_the_next() {
    let (_servers, set) = one_registered_shard().await;
    let shard = set.get(0);
    let mut a = shard.user_client().await.unwrap();
    let pid: i32 = a
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let a_tx = a.transaction().await.unwrap();
    assert!(tick_on(&*a_tx, minute(1)).await.job.is_some());
    // Killed before its commit: the server ends the backend, the transaction aborts.
    let admin = shard.client().await.unwrap();
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    assert!(a_tx.commit().await.is_err());
    drop(a);
    assert_eq!(jobs_of(shard, minute(1)).await, 0);

    let next = tick_on(&***admin, minute(1)).await;
    assert!(next.advanced && next.job.is_some(), "{next:?}");
    assert_eq!(jobs_of(shard, minute(1)).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_behind_in_time_enqueues_nothing_for_older_ticks() {
    let (_servers, set) = one_registered_shard().await;
    let shard = set.get(0);
    let db = shard.user_client().await.unwrap();
    assert!(tick_on(&**db, minute(2)).await.job.is_some());
    // A process whose clock is behind reaches minute 1 (and 2) only now.
    for old in [minute(1), minute(2)] {
        assert_eq!(tick_on(&**db, old).await.job, None);
    }
    assert_eq!(jobs_of(shard, minute(1)).await, 0);
    assert_eq!(jobs_of(shard, minute(2)).await, 1);
    let last = schedules::last_tick(shard, NAME).await.unwrap().unwrap();
    assert_eq!(last.at, minute(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_tick_under_skip_moves_last_tick_without_a_job() {
    let (_servers, set) = one_registered_shard().await;
    let shard = set.get(0);
    let s = schedule();
    let job = s.job_for(minute(3));
    let skip = Tick {
        name: NAME,
        at: minute(3),
        shard_key: s.shard_key(),
        job: &job,
        max_attempts: 3,
        enqueue: false,
    };
    let outcome = schedules::tick(shard, skip).await.unwrap();
    assert_eq!(
        outcome,
        TickOutcome {
            not_yet: false,
            advanced: true,
            job: None,
            moved: false,
        }
    );
    assert_eq!(jobs_of(shard, minute(3)).await, 0);
    let db = shard.client().await.unwrap();
    assert_eq!(
        tick_on(&***db, minute(3)).await.job,
        None,
        "recorded as handled"
    );
}
