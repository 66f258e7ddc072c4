//! The versioned shard map's epoch fence: a shard refuses a write routed by
//! an older epoch than its own (SQLSTATE SQ004, the current epoch in
//! DETAIL) and writes nothing; the Rust client then reloads the map and
//! routes the job again, writing it once.

use crate::common;

use common::TestShards;
use serde_json::json;
use shardq::router;
use shardq::shards::ShardSet;
use shardq::{Client, NewJob, OnDuplicate};
use tokio_postgres::NoTls;

/// Stale shard map (docs/enqueue-from-sql.md).
const STALE_MAP: &str = "SQ004";

/// Records epoch 2 on every shard, by hand: the same ranges as epoch 1 (a
/// new epoch that moves nothing, as a finished move of no keys would).
async fn record_epoch_2(shards: &ShardSet) {
    for shard in shards.all() {
        shard
            .client()
            .await
            .unwrap()
            .batch_execute(
                "INSERT INTO shardq_map_epochs (epoch, shard_count) \
                     SELECT 2, shard_count FROM shardq_map_epochs WHERE epoch = 1; \
                 INSERT INTO shardq_map_ranges (epoch, first_key, end_key, shard_index) \
                     SELECT 2, first_key, end_key, shard_index FROM shardq_map_ranges \
                     WHERE epoch = 1",
            )
            .await
            .expect("record epoch 2");
    }
}

/// The jobs of `queue` on each shard.
async fn counts(shards: &ShardSet, queue: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for shard in shards.all() {
        let db = shard.client().await.unwrap();
        let row = db
            .query_one(
                "SELECT count(*) FROM workflow_status WHERE queue = $1",
                &[&queue],
            )
            .await
            .unwrap();
        out.push(row.get(0));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_an_old_map_is_refused_reloads_and_writes_once() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::new(&config).expect("client");
    // Started before the new epoch: its first enqueue loads epoch 1.
    client
        .enqueue(NewJob::new("warm", "noop", json!({})))
        .await
        .expect("enqueue at epoch 1");
    assert_eq!(client.shards().routing().get().epoch(), 1);

    record_epoch_2(&set).await;
    let keyed = NewJob::new("fenced", "noop", json!({})).ordering_key("customer-7");
    let deduplicated =
        NewJob::new("fenced", "noop", json!({})).dedup("order-9", OnDuplicate::Error);
    let ids = client
        .enqueue_many(vec![keyed, deduplicated])
        .await
        .expect("refused, reloaded, written");

    assert_eq!(
        client.shards().routing().get().epoch(),
        2,
        "the refusal made the client reload the map"
    );
    let mut expected = vec![0i64; 2];
    for key in ["customer-7", "order-9"] {
        expected[router::shard_index(router::shard_key_for(key), 2)] += 1;
    }
    assert_eq!(
        counts(&set, "fenced").await,
        expected,
        "each job written once, on the shard its key routes to"
    );
    for id in ids {
        assert!(client.job(id).await.expect("read").is_some(), "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shardq_enqueue_with_an_old_epoch_gets_sq004_and_writes_nothing() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let (db, connection) = tokio_postgres::connect(&shards.urls[0], NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let enqueue = "SELECT job_id FROM shardq_enqueue('fenced', 'noop', '{}', 'k', \
        p_epoch => $1)";
    db.query_one(enqueue, &[&1i32])
        .await
        .expect("epoch 1 is current");

    record_epoch_2(&set).await;
    let err = db.query_one(enqueue, &[&1i32]).await.unwrap_err();
    let refusal = err.as_db_error().expect("a server error");
    assert_eq!(refusal.code().code(), STALE_MAP, "{refusal}");
    assert_eq!(refusal.detail(), Some("epoch=2"), "{refusal}");
    assert!(
        refusal
            .hint()
            .unwrap_or("")
            .contains("reload the shard map"),
        "{refusal}"
    );
    let batch = "SELECT count(*) FROM shardq_enqueue_many('[{\"queue\": \"fenced\", \
        \"handler\": \"noop\"}]', 1)";
    let err = db.query_one(batch, &[]).await.unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some(STALE_MAP), "{err:?}");
    assert_eq!(
        counts(&set, "fenced").await,
        vec![1],
        "the refusals wrote nothing"
    );

    let route: i32 = db
        .query_one("SELECT epoch FROM shardq_route('k')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(route, 2, "shardq_route names the current epoch");
    db.query_one(enqueue, &[&2i32])
        .await
        .expect("epoch 2 is current");
    db.query_one(
        "SELECT job_id FROM shardq_enqueue('fenced', 'noop', '{}', 'k')",
        &[],
    )
    .await
    .expect("no epoch: the current one");
    assert_eq!(counts(&set, "fenced").await, vec![3]);
}

/// Epoch 2 on one shard only: keys 0..30000 on shard `low`, the rest on the
/// other (of two).
async fn record_split_epoch_2(shard: &shardq::shards::Shard, low: i32) {
    shard
        .client()
        .await
        .unwrap()
        .execute(
            "WITH e AS (INSERT INTO shardq_map_epochs (epoch, shard_count) VALUES (2, 2)) \
             INSERT INTO shardq_map_ranges (epoch, first_key, end_key, shard_index) \
             VALUES (2, 0, 30000, $1), (2, 30000, 65536, 1 - $1)",
            &[&low],
        )
        .await
        .expect("record epoch 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_that_disagree_about_an_epoch_are_refused_and_a_newer_one_wins() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    // One shard a move ahead of the other: the newer epoch is the map.
    record_split_epoch_2(set.get(0), 1).await;
    let map = set.load_map().await.expect("load");
    assert_eq!(map.epoch(), 2);
    assert_eq!((map.shard_for(0), map.shard_for(30000)), (1, 0));
    // The other shard records another epoch 2: refused, naming both.
    record_split_epoch_2(set.get(1), 0).await;
    let client = Client::new(&config).expect("client");
    let err = client
        .enqueue(NewJob::new("q", "noop", json!({})))
        .await
        .unwrap_err();
    match &err {
        shardq::ClientError::Map(shardq::client::MapLoadError::Disagree {
            epoch,
            first,
            second,
        }) => {
            assert_eq!(*epoch, 2);
            assert_eq!((first.as_str(), second.as_str()), ("s0", "s1"));
        }
        other => panic!("expected a disagreement, got {other:?}"),
    }
    assert_eq!(counts(&set, "q").await, vec![0, 0], "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_that_do_not_tile_are_refused_by_check_and_migrate() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    set.get(0)
        .client()
        .await
        .unwrap()
        .batch_execute(
            "INSERT INTO shardq_map_epochs (epoch, shard_count) VALUES (2, 1); \
             INSERT INTO shardq_map_ranges VALUES (2, 0, 100, 0), (2, 101, 65536, 0)",
        )
        .await
        .unwrap();
    for err in [
        shardq::migrate::check_all(&set).await.unwrap_err(),
        shardq::migrate::migrate_all(&set).await.unwrap_err(),
    ] {
        match &err {
            shardq::migrate::MigrateError::MapNotTiled { shard, epochs } => {
                assert_eq!((shard.as_str(), epochs.as_slice()), ("s0", &[2][..]));
            }
            other => panic!("expected untiled ranges, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_routed_before_a_new_epoch_is_refused_in_the_callers_transaction() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::new(&config).expect("client");
    client.shards().load_map().await.expect("load epoch 1");
    let job = NewJob::new("fenced", "noop", json!({})).ordering_key("customer-7");
    let routed = client.route(job.clone()).expect("route");

    record_epoch_2(&set).await;
    let mut db = routed.shard().user_client().await.unwrap();
    let tx = db.transaction().await.unwrap();
    let err = routed.insert(&*tx).await.unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some(STALE_MAP), "{err:?}");
    tx.rollback().await.unwrap();
    assert_eq!(counts(&set, "fenced").await, vec![0, 0]);

    // Reloaded and routed again: written in the caller's transaction.
    client.shards().load_map().await.expect("load epoch 2");
    let routed = client.route(job).expect("route");
    let tx = db.transaction().await.unwrap();
    routed.insert(&*tx).await.expect("insert at epoch 2");
    tx.commit().await.unwrap();
    assert_eq!(counts(&set, "fenced").await.iter().sum::<i64>(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_loads_the_map_from_the_shards_that_answer() {
    let mut shards = TestShards::databases(2).await;
    let set = shards.migrated(&shards.config("")).await;
    // Shard s1 unreachable from the client (nothing listens on port 1).
    shards.urls[1] = "postgres://postgres@127.0.0.1:1/shardq?connect_timeout=1".into();
    let client =
        Client::new(&shards.config("[database]\nconnect_timeout_ms = 500\n")).expect("client");
    let key = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| router::shard_index(router::shard_key_for(k), 2) == 0)
        .unwrap();
    client
        .enqueue(NewJob::new("fenced", "noop", json!({})).ordering_key(key))
        .await
        .expect("the job of the shard that answers is written");
    assert!(client.shards().routing().loaded());
    assert_eq!(counts(&set, "fenced").await, vec![1, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_refuses_a_key_of_another_shard_with_sq001() {
    let shards = TestShards::databases(4).await;
    let set = shards.migrated(&shards.config("")).await;
    let db = set.get(1).client().await.unwrap();
    // Shard 1 of 4 holds 16384..32768.
    let own: Vec<i32> = (16384..32768).collect();
    let ok: bool = db
        .query_one("SELECT shardq_check_route(1, VARIADIC $1::int[])", &[&own])
        .await
        .expect("every key its own")
        .get(0);
    assert!(ok);
    let with_stray: Vec<i32> = vec![16384, 32768];
    let err = db
        .query_one(
            "SELECT shardq_check_route(NULL, VARIADIC $1::int[])",
            &[&with_stray],
        )
        .await
        .unwrap_err();
    let refusal = err.as_db_error().expect("a server error");
    assert_eq!(refusal.code().code(), "SQ001", "{refusal}");
    assert_eq!(
        refusal.detail(),
        Some("shard_key=32768 shard_index=2 epoch=1"),
        "{refusal}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_refused_after_some_of_it_was_written_keeps_what_was_written() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::new(&config).expect("client");
    client.shards().load_map().await.expect("load epoch 1");
    // The first insert of the call records epoch 2 (same ranges) as it
    // commits: the call's next statement, at epoch 1, is refused.
    set.get(0)
        .client()
        .await
        .unwrap()
        .batch_execute(
            "CREATE FUNCTION test_new_epoch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 INSERT INTO shardq_map_epochs (epoch, shard_count) \
                     SELECT 2, shard_count FROM shardq_map_epochs WHERE epoch = 1 \
                     ON CONFLICT DO NOTHING; \
                 INSERT INTO shardq_map_ranges \
                     SELECT 2, first_key, end_key, shard_index FROM shardq_map_ranges \
                     WHERE epoch = 1 ON CONFLICT DO NOTHING; \
                 RETURN NULL; END $$; \
             CREATE TRIGGER test_new_epoch AFTER INSERT ON workflow_status \
                 FOR EACH STATEMENT EXECUTE FUNCTION test_new_epoch()",
        )
        .await
        .expect("trigger");
    let ids = client
        .enqueue_many(vec![
            NewJob::new("fenced", "noop", json!({})).ordering_key("plain"),
            NewJob::new("fenced", "noop", json!({})).dedup("once", OnDuplicate::Error),
        ])
        .await
        .expect("written");
    assert_eq!(client.shards().routing().get().epoch(), 2, "refused once");
    assert_eq!(
        counts(&set, "fenced").await,
        vec![2],
        "the job written before the refusal is not written again"
    );
    for id in ids {
        assert!(client.job(id).await.expect("read").is_some(), "{id}");
    }
}

/// A change of the map marks its transaction before it commits (an opening
/// of a range runs under the move lock, not the map's): a READ COMMITTED
/// enqueue that runs in that instant must not be refused, its statement
/// reads after every lock that orders it with the change. A REPEATABLE
/// READ one whose snapshot predates the change still is (40001).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_during_a_map_change_commit_is_refused_only_with_an_older_snapshot() {
    let dbs = TestShards::databases(1).await;
    let config = dbs.config("");
    let set = dbs.migrated(&config).await;
    let shard = set.get(0);
    let mut change = shard.client().await.unwrap();
    let mut stale = shard.client().await.unwrap();
    // A REPEATABLE READ transaction whose snapshot predates the change.
    let old = stale
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await
        .unwrap();
    old.query_one("SELECT 1", &[]).await.unwrap();
    // The change, marked, not committed yet.
    let tx = change.transaction().await.unwrap();
    tx.query_one(
        "SELECT setval('shardq_map_change_xid', pg_current_xact_id()::text::bigint)",
        &[],
    )
    .await
    .unwrap();
    let check = "SELECT shardq_check_route(1, 7)";
    let plain = shard.client().await.unwrap();
    plain
        .query_one(check, &[])
        .await
        .expect("a READ COMMITTED enqueue goes on while the change commits");
    tx.commit().await.unwrap();
    plain.query_one(check, &[]).await.expect("and after it");
    let refused = old.query_one(check, &[]).await.unwrap_err();
    assert_eq!(
        refused.code().map(|c| c.code()),
        Some("40001"),
        "a snapshot older than the change: {refused:?}"
    );
}

/// A client whose write was refused as routed by an old map asks its shard
/// which of its jobs an earlier statement wrote, by their reserved ids. A
/// move may have copied another job under one of those ids (each shard
/// numbers its own jobs): that row is not this job, which must be routed
/// again, not taken as written (the likely cause of a job the shrink test
/// under load lost once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_job_under_a_reserved_id_is_not_taken_for_the_refused_write() {
    let dbs = TestShards::databases(1).await;
    let config = dbs.config("");
    let set = dbs.migrated(&config).await;
    let shard = set.get(0);
    let key = router::shard_key_for("key-7");
    // The copy: revision 3 of key-7, under id 41, written as a move writes.
    shard
        .client()
        .await
        .unwrap()
        .execute(
            "INSERT INTO workflow_status \
                 (shard_key, id, queue, handler, ordering_key, payload, status, held_status) \
             OVERRIDING SYSTEM VALUE VALUES ($1, 41, 'moving', 'record', 'key-7', '{\"revision\": 3}', 'held', 'queued')",
            &[&key],
        )
        .await
        .unwrap();
    let id = shardq::JobId {
        shard_key: key,
        id: 41,
    };
    let revision =
        |r: i64| NewJob::new("moving", "record", json!({ "revision": r })).ordering_key("key-7");
    let (mine, copied) = (revision(4), revision(3));
    let found = shardq::store::jobs::present(shard, &[(id, &mine)])
        .await
        .unwrap();
    assert!(found.is_empty(), "revision 4 was never written: {found:?}");
    let found = shardq::store::jobs::present(shard, &[(id, &copied)])
        .await
        .unwrap();
    assert_eq!(found, vec![41], "the job as written is found");
}
