//! The shard map: every shard records its place in the configured shard list
//! (count and index); `migrate` and the start check refuse a list that
//! disagrees, and lookups by job id find a job written under an older list.

use crate::common;

use common::TestShards;
use shardq::client::JobOutcome;
use shardq::config::Config;
use shardq::migrate::{self, MigrateError};
use shardq::router;
use shardq::shards::{Shard, ShardSet};
use shardq::{Client, NewJob};

/// A config listing `shards` (name, URL) in this order.
fn config_of(shards: &[(&str, &str)]) -> Config {
    let mut text = String::new();
    for (name, url) in shards {
        text.push_str(&format!(
            "[[shards]]\nname = \"{name}\"\nurl = \"{url}\"\npool_size = 4\n\n"
        ));
    }
    Config::from_toml(&text).expect("valid config")
}

/// The recorded (count, index) of one shard, if any.
async fn recorded_map(shard: &Shard) -> Option<(i32, i32)> {
    shard
        .client()
        .await
        .unwrap()
        .query_opt("SELECT shard_count, shard_index FROM shardq_shard_map", &[])
        .await
        .unwrap()
        .map(|r| (r.get(0), r.get(1)))
}

/// Asserts `e` is a shard-map mismatch of `shard` with these places, and that
/// its message says what is wrong and where to read what to do.
fn assert_map_error(e: &MigrateError, shard: &str, recorded: (i32, i32), configured: (i32, i32)) {
    match e {
        MigrateError::ShardMap {
            shard: s,
            recorded_count,
            recorded_index,
            configured_count,
            configured_index,
        } => {
            assert_eq!(s, shard, "{e}");
            assert_eq!((*recorded_count, *recorded_index), recorded, "{e}");
            assert_eq!((*configured_count, *configured_index), configured, "{e}");
        }
        other => panic!("expected a shard map error, got: {other}"),
    }
    let text = e.to_string();
    for part in [
        format!("shard `{shard}`"),
        format!("shard {} of {}", recorded.1, recorded.0),
        format!("shard {} of {}", configured.1, configured.0),
        "Changing the shard list".to_string(),
    ] {
        assert!(text.contains(&part), "`{part}` missing from: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_list_that_grew_or_was_reordered_is_refused() {
    let dbs = TestShards::databases(3).await;
    let (a, b, c) = (
        dbs.urls[0].as_str(),
        dbs.urls[1].as_str(),
        dbs.urls[2].as_str(),
    );
    let two = ShardSet::connect(&config_of(&[("s0", a), ("s1", b)])).unwrap();
    migrate::migrate_all(&two).await.expect("first migrate");
    assert_eq!(recorded_map(two.get(0)).await, Some((2, 0)));
    assert_eq!(recorded_map(two.get(1)).await, Some((2, 1)));
    // The same list again: nothing to do, nothing refused.
    let again = migrate::migrate_all(&two).await.expect("second migrate");
    assert!(again.iter().all(Vec::is_empty), "{again:?}");
    migrate::check_all(&two)
        .await
        .expect("the same list passes");

    // One more shard: migrate and the start check both refuse, naming the shard.
    let three = ShardSet::connect(&config_of(&[("s0", a), ("s1", b), ("s2", c)])).unwrap();
    let e = migrate::migrate_all(&three).await.unwrap_err();
    assert_map_error(&e, "s0", (2, 0), (3, 0));
    let e = migrate::check_all(&three).await.unwrap_err();
    assert_map_error(&e, "s0", (2, 0), (3, 0));
    let e = migrate::check_shard(three.get(1), 3).await.unwrap_err();
    assert_map_error(&e, "s1", (2, 1), (3, 1));
    // The refused migrate changed nothing on the old shards.
    assert_eq!(recorded_map(two.get(0)).await, Some((2, 0)));

    // The same shards in another order: refused by index.
    let swapped = ShardSet::connect(&config_of(&[("s1", b), ("s0", a)])).unwrap();
    let e = migrate::migrate_all(&swapped).await.unwrap_err();
    assert_map_error(&e, "s1", (2, 1), (2, 0));
    let e = migrate::check_all(&swapped).await.unwrap_err();
    assert_map_error(&e, "s1", (2, 1), (2, 0));
    // The worker checks one shard at a time: a shard out of its place is
    // refused, one in its place passes.
    let e = migrate::check_shard(swapped.get(0), 2).await.unwrap_err();
    assert_map_error(&e, "s1", (2, 1), (2, 0));
    migrate::check_shard(two.get(1), 2)
        .await
        .expect("one shard of the migrated list, in its place");
}

/// Whether `shard` has any shardq table (a refused migrate must leave none).
async fn has_schema(shard: &Shard) -> bool {
    shard
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT to_regclass('shardq_migrations') IS NOT NULL \
                 OR to_regclass('workflow_status') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_whose_third_shard_mismatches_changes_no_shard_and_the_right_list_migrates() {
    let dbs = TestShards::databases(3).await;
    let (a, b, c) = (
        dbs.urls[0].as_str(),
        dbs.urls[1].as_str(),
        dbs.urls[2].as_str(),
    );
    // `c` was migrated as the first of [c, a, b] (a run stopped after it).
    let right = ShardSet::connect(&config_of(&[("c", c), ("a", a), ("b", b)])).unwrap();
    migrate::migrate_shard(right.get(0), 3).await.unwrap();

    // The same shards listed with `c` third: refused, naming `c`, before the
    // first two are changed at all.
    let wrong = ShardSet::connect(&config_of(&[("a", a), ("b", b), ("c", c)])).unwrap();
    let e = migrate::migrate_all(&wrong).await.unwrap_err();
    assert_map_error(&e, "c", (3, 0), (3, 2));
    for shard in &wrong.all()[..2] {
        assert!(!has_schema(shard).await, "`{}` was changed", shard.name);
    }
    assert_eq!(recorded_map(right.get(0)).await, Some((3, 0)));

    // The right list is not blocked by the refused one.
    migrate::migrate_all(&right)
        .await
        .expect("the right list migrates");
    migrate::check_all(&right)
        .await
        .expect("current and mapped");
    for (i, shard) in right.all().iter().enumerate() {
        assert_eq!(recorded_map(shard).await, Some((3, i as i32)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_map_is_recorded_in_the_transaction_that_creates_its_table() {
    let dbs = TestShards::databases(2).await;
    let config = dbs.config("");
    let set = dbs.migrated(&config).await;
    for shard in set.all() {
        // `now()` is the transaction's start: equal stamps, one transaction.
        let same: bool = shard
            .client()
            .await
            .unwrap()
            .query_one(
                "SELECT m.recorded_at = v.applied_at FROM shardq_shard_map m, shardq_migrations v \
                 WHERE v.name = '0005_shard_map.sql'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            same,
            "`{}`: the map was recorded in a later transaction",
            shard.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_migrated_before_the_map_gets_it_on_the_next_migrate() {
    let dbs = TestShards::databases(2).await;
    let config = dbs.config("");
    let set = dbs.migrated(&config).await;
    // Back to version 4, as a shard migrated by an older shardq.
    for shard in set.all() {
        shard
            .client()
            .await
            .unwrap()
            .batch_execute(
                "DROP TABLE shardq_shard_map; DROP INDEX IF EXISTS workflow_status_scheduled_queue; \
                 DROP INDEX workflow_status_scheduled_by_kind; \
                 ALTER TABLE workflow_status DROP COLUMN parked; \
                 DROP TABLE IF EXISTS shardq_paused_queues; DROP TABLE IF EXISTS shardq_schedules; \
                 DROP TABLE IF EXISTS shardq_workers; \
                 DROP TABLE IF EXISTS shardq_map_moves, shardq_map_ranges, shardq_map_epochs; \
                 DROP SEQUENCE IF EXISTS shardq_map_change_xid; \
                 DROP TABLE IF EXISTS shardq_queue_limits, shardq_limit_leases, shardq_rate_buckets; \
                 DROP TABLE IF EXISTS shardq_limit_holders, shardq_limit_lease_moves; \
                 DROP SEQUENCE IF EXISTS shardq_limit_lease_seq; \
                 DELETE FROM shardq_functions WHERE name = 'shardq_refuse_old_limits_write'; \
                 DROP TABLE IF EXISTS shardq_group_tokens, shardq_group_buckets; \
                 DROP SEQUENCE IF EXISTS shardq_group_bucket_seq; \
                 DELETE FROM shardq_functions WHERE name IN ('shardq_group_buckets_of', \
                     'shardq_group_buckets_write'); \
                 DROP TABLE IF EXISTS workflow_messages, workflow_events; \
                 DROP TRIGGER IF EXISTS shardq_ready_on_insert ON workflow_status; \
                 DROP TRIGGER IF EXISTS shardq_ready_on_update ON workflow_status; \
                 DROP TRIGGER IF EXISTS shardq_turn_on_insert ON workflow_status; \
                 DROP TRIGGER IF EXISTS shardq_turn_on_update ON workflow_status; \
                 DROP VIEW IF EXISTS shardq_group_rounds; \
                 DROP TABLE IF EXISTS shardq_group_round_moves, shardq_group_queues; \
                 ALTER TABLE workflow_status DROP COLUMN IF EXISTS turn; \
                 DELETE FROM shardq_functions WHERE name = 'shardq_take_turn'; \
                 DROP VIEW IF EXISTS shardq_ready_floors; \
                 DROP TABLE IF EXISTS shardq_ready_floor_moves, shardq_ready_barrier, \
                     shardq_ready_levels; \
                 DROP TABLE IF EXISTS shardq_relay_leases; \
                 DROP TABLE IF EXISTS shardq_cascades_owed; \
                 DROP TABLE IF EXISTS shardq_key_floors; \
                 DROP TABLE IF EXISTS shardq_lease_floor_moves; \
                 DROP SEQUENCE IF EXISTS shardq_cascades_owed_generation; \
                 DROP SEQUENCE IF EXISTS shardq_ready_seq; \
                 ALTER TABLE workflow_status DROP COLUMN IF EXISTS ready_seq; \
                 DELETE FROM shardq_functions WHERE name IN ('shardq_mark_ready', 'shardq_ensure_floors'); \
                 DROP TYPE IF EXISTS shardq_claimed CASCADE; \
                 DELETE FROM shardq_functions WHERE name IN ('shardq_take', 'shardq_claim', \
                     'shardq_claim_keyed', 'shardq_claim_grouped'); \
                 ALTER TABLE workflow_status DROP COLUMN IF EXISTS job_group; \
                 ALTER TABLE workflow_status DROP COLUMN IF EXISTS held_status; \
                 DROP INDEX IF EXISTS workflow_status_failed; \
                 DELETE FROM shardq_migrations WHERE version >= 5",
            )
            .await
            .unwrap();
    }
    let e = migrate::check_all(&set).await.unwrap_err();
    assert!(matches!(e, MigrateError::Behind { found: 4, .. }), "{e}");
    let applied = migrate::migrate_all(&set).await.unwrap();
    // Every migration from 5 on (later ones too, whatever their numbers).
    let from_5: Vec<i32> = migrate::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .filter(|&v| v >= 5)
        .collect();
    assert_eq!(applied, vec![from_5.clone(), from_5]);
    assert_eq!(recorded_map(set.get(0)).await, Some((2, 0)));
    assert_eq!(recorded_map(set.get(1)).await, Some((2, 1)));
    migrate::check_all(&set).await.expect("current and mapped");

    // A current schema whose map row is gone is refused, and migrate restores it.
    set.get(1)
        .client()
        .await
        .unwrap()
        .batch_execute("DELETE FROM shardq_shard_map")
        .await
        .unwrap();
    let e = migrate::check_all(&set).await.unwrap_err();
    assert!(
        matches!(&e, MigrateError::ShardMapMissing { shard } if shard == "s1"),
        "{e}"
    );
    migrate::migrate_all(&set).await.unwrap();
    migrate::check_all(&set).await.expect("map recorded again");
}

/// An ordering key starting with `prefix` whose shard key routes to shard
/// `old` of `old_count` and to shard `new` of `new_count`.
fn key_routed(prefix: &str, old_count: usize, old: usize, new_count: usize, new: usize) -> String {
    (0..100_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| {
            let sk = router::shard_key_for(k);
            router::shard_index(sk, old_count) == old && router::shard_index(sk, new_count) == new
        })
        .expect("some key routes so")
}

/// Status of job `id` on `shard`, read directly.
async fn status_on(shard: &Shard, id: shardq::JobId) -> Option<String> {
    shard
        .client()
        .await
        .unwrap()
        .query_opt(
            "SELECT status FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// Enqueues a job with `key` through `writer`, then shows, cancels, waits for
/// and retries it through `reader`, whose routing sends its key to another
/// shard; `home` is the shard it was written on.
async fn lookups_find_a_moved_job(writer: &Client, reader: &Client, home: &Shard, key: &str) {
    let id = writer
        .enqueue(NewJob::new("q", "noop", serde_json::json!({})).ordering_key(key))
        .await
        .unwrap();
    assert_eq!(status_on(home, id).await.as_deref(), Some("queued"));
    let routed = reader.shards().for_key(id.shard_key);
    assert_eq!(
        status_on(routed, id).await,
        None,
        "the reader's routed shard `{}` must not hold the job, so only the fallback finds it",
        routed.name
    );

    let info = reader.job(id).await.unwrap().expect("job found elsewhere");
    assert_eq!(
        (info.status.as_str(), info.ordering_key.as_deref()),
        ("queued", Some(key))
    );
    assert_eq!(
        reader.cancel(id).await.unwrap().map(|s| s.as_str()),
        Some("cancelled")
    );
    assert_eq!(status_on(home, id).await.as_deref(), Some("cancelled"));
    assert_eq!(
        reader
            .result(id, std::time::Duration::from_secs(5))
            .await
            .unwrap(),
        JobOutcome::Cancelled
    );
    assert!(reader.retry(id).await.unwrap(), "retried where it lives");
    assert_eq!(status_on(home, id).await.as_deref(), Some("queued"));
    assert_eq!(reader.job(id).await.unwrap().unwrap().status, "queued");
    // Finished or unchanged jobs still answer as before.
    assert!(
        !reader.retry(id).await.unwrap(),
        "a queued job is not retried"
    );
    assert_eq!(
        status_on(routed, id).await,
        None,
        "nothing was written there"
    );

    // An id no shard holds is still not found.
    let missing = shardq::JobId {
        shard_key: id.shard_key,
        id: id.id + 1_000_000,
    };
    assert!(reader.job(missing).await.unwrap().is_none());
    assert_eq!(reader.cancel(missing).await.unwrap(), None);
    assert!(!reader.retry(missing).await.unwrap());
    assert!(matches!(
        reader
            .result(missing, std::time::Duration::from_millis(100))
            .await,
        Err(shardq::ClientError::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_by_id_find_jobs_written_under_another_shard_list() {
    let dbs = TestShards::databases(3).await;
    let (a, b, c) = (
        dbs.urls[0].as_str(),
        dbs.urls[1].as_str(),
        dbs.urls[2].as_str(),
    );
    let two_config = config_of(&[("s0", a), ("s1", b)]);
    let two = ShardSet::connect(&two_config).unwrap();
    migrate::migrate_all(&two).await.unwrap();
    // The added shard, migrated on its own (its map differs; the readers
    // below are built without the start check that would refuse them).
    let alone = ShardSet::connect(&config_of(&[("s2", c)])).unwrap();
    migrate::migrate_all(&alone).await.unwrap();
    let writer = Client::from_shards(two.clone(), two_config.limits.clone());

    // Same shards, other order: every key routes to the other shard.
    let swapped_config = config_of(&[("s1", b), ("s0", a)]);
    let swapped = Client::from_shards(
        ShardSet::connect(&swapped_config).unwrap(),
        swapped_config.limits.clone(),
    );
    let key = key_routed("swapped", 2, 0, 2, 0);
    lookups_find_a_moved_job(&writer, &swapped, two.get(0), &key).await;

    // One more shard: a key written on s0 now routes to s1.
    let grown_config = config_of(&[("s0", a), ("s1", b), ("s2", c)]);
    let grown = Client::from_shards(
        ShardSet::connect(&grown_config).unwrap(),
        grown_config.limits.clone(),
    );
    let key = key_routed("grown-a", 2, 0, 3, 1);
    lookups_find_a_moved_job(&writer, &grown, two.get(0), &key).await;
    // And one written on s1 now routes to the new s2.
    let key = key_routed("grown-b", 2, 1, 3, 2);
    lookups_find_a_moved_job(&writer, &grown, two.get(1), &key).await;
}
