//! Schedules whose key moves: the worker follows it, a tick in flight is
//! copied.

use crate::common;

use super::{growing_to_three, moving_key, WORKER_TOML};
use common::{ShardList, TestShards};
use serde_json::json;
use shardq::reshard::{reshard, Options};
use shardq::shards::ShardSet;
use shardq::{Config, HandlerRegistry, NewJob, OnDuplicate, Worker};
use std::collections::HashMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A schedule whose key is on the shard that leaves (3 → 2): its worker,
/// running through the move, is refused on the old shard, finds the new one
/// and goes on from the last tick copied there. Every tick is enqueued once,
/// and those after the move on the schedule's new shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_follows_its_key_to_its_new_shard() {
    let servers = TestShards::databases(3).await;
    let name = (0..)
        .map(|i| format!("tick-{i}"))
        .find(|n| shardq::router::shard_key_for(n) >= 43_691)
        .unwrap();
    let toml = format!(
        "[worker]\nqueues = [\"ticks\"]\nconcurrency = 2\nmaintenance_interval_ms = 100\n\n\
         [[schedules]]\nname = \"{name}\"\ncron = \"* * * * * *\"\nqueue = \"ticks\"\n\
         handler = \"noop\"\n"
    );
    let config =
        Config::from_toml(&ShardList::numbered(&servers.urls).pool_size(12).toml(&toml)).unwrap();
    let all = ShardSet::connect(&config).unwrap();
    shardq::migrate::migrate_all(&all).await.unwrap();
    let stop = CancellationToken::new();
    let running = {
        let (config, shards, stop) = (config.clone(), all.clone(), stop.clone());
        tokio::spawn(async move {
            Worker::new(config, shards, HandlerRegistry::with_builtins())
                .run(stop)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let summary = reshard(&all, 3, 2, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    let moved_at = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    stop.cancel();
    running.await.unwrap();

    let owner = all
        .load_map()
        .await
        .unwrap()
        .shard_for(shardq::router::shard_key_for(&name));
    assert_ne!(owner, 2);
    let mut ticks: HashMap<String, usize> = HashMap::new();
    let mut after = 0;
    for shard in all.all() {
        let db = shard.client().await.unwrap();
        for r in db
            .query(
                "SELECT dedup_id, created_at FROM workflow_status WHERE queue = 'ticks'",
                &[],
            )
            .await
            .unwrap()
        {
            *ticks.entry(r.get(0)).or_default() += 1;
            if r.get::<_, chrono::DateTime<chrono::Utc>>(1) > moved_at {
                after += 1;
                assert_eq!(shard.index, owner, "a tick after the move on its old shard");
            }
        }
    }
    assert!(
        ticks.values().all(|&n| n == 1),
        "a tick enqueued twice: {ticks:?}"
    );
    assert!(
        after >= 2,
        "the schedule ticked on after the move ({after})"
    );
    assert!(ticks.len() >= 4, "{ticks:?}");
}

/// A schedule's tick on its old shard whose statement passed the ownership
/// check before the new epoch was written, committing only after: the move
/// must copy that tick, or the new shard runs it again. The tick is driven
/// in an open transaction; the move waits for it (the tick holds the map's
/// lock shared), and the schedule's copy on the new shard has it. Before,
/// the move went on, copied the older tick, and the same tick could run
/// on both shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_in_flight_when_the_move_begins_is_copied_with_its_schedule() {
    let m = growing_to_three(TestShards::databases(3).await, WORKER_TOML).await;
    let name = moving_key(&m.plan, "every-second");
    let shard_key = shardq::router::shard_key_for(&name);
    let old = m.all.get(usize::from(shard_key >= 32_768));
    // Whole microseconds, as the database keeps them.
    let earlier = chrono::DateTime::from_timestamp_micros(
        (chrono::Utc::now() - chrono::Duration::seconds(10)).timestamp_micros(),
    )
    .unwrap();
    old.client()
        .await
        .unwrap()
        .execute(
            "INSERT INTO shardq_schedules (name, last_tick, updated_at) VALUES ($1, $2, now())",
            &[&name, &earlier],
        )
        .await
        .unwrap();
    let tick_at = earlier + chrono::Duration::seconds(5);
    let job = NewJob::new("ticks", "noop", json!({}))
        .dedup(format!("{name}@5"), OnDuplicate::ReturnExisting);
    let mut db = old.user_client().await.unwrap();
    let tx = db.transaction().await.unwrap();
    let outcome = shardq::store::schedules::tick_in(
        &*tx,
        shardq::store::schedules::Tick {
            name: &name,
            at: tick_at,
            shard_key,
            job: &job,
            max_attempts: 3,
            enqueue: true,
        },
    )
    .await
    .unwrap();
    assert!(outcome.advanced && !outcome.moved, "{outcome:?}");

    let moving = tokio::spawn({
        let all = m.all.clone();
        async move { reshard(&all, 2, 3, &Options::default(), |_| {}).await }
    });
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !moving.is_finished(),
        "the move waits for the tick in flight"
    );
    tx.commit().await.unwrap();
    let summary = moving.await.unwrap().unwrap();
    assert!(summary.complete);

    let copied: chrono::DateTime<chrono::Utc> = m
        .all
        .get(2)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT last_tick FROM shardq_schedules WHERE name = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(copied, tick_at, "the new shard knows the tick ran");
}
