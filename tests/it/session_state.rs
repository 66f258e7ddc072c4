//! Session state leaks neither way. A `SET` made on a pooled connection does
//! not reach the statements that use the connection next (before, it stayed
//! for every later claim), and shardq's own settings (index-only plans,
//! `lock_timeout`, `statement_timeout`) never reach your statements:
//! transactional enqueue runs on a connection of your own or on
//! `Shard::user_client`, which carries the server's settings.

use crate::common;

use common::TestShards;
use shardq::{Client, NewJob};

async fn show(client: &deadpool_postgres::Client, name: &str) -> String {
    client
        .query_one(&format!("SHOW {name}"), &[])
        .await
        .unwrap()
        .get(0)
}

/// Its backend's pid, after a `SET` of two settings on it.
async fn set_on(client: &deadpool_postgres::Client) -> i32 {
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    client
        .batch_execute("SET enable_indexscan = off; SET work_mem = '64kB'")
        .await
        .unwrap();
    pid
}

/// Its backend's pid, and the two settings [`set_on`] changes.
async fn settings_of(client: &deadpool_postgres::Client) -> (i32, String, String) {
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    (
        pid,
        show(client, "enable_indexscan").await,
        show(client, "work_mem").await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_on_a_pooled_connection_does_not_outlive_its_use() {
    let shards = TestShards::databases(1).await;
    // One connection per pool, so the next checkout is the same connection.
    let toml = shards.toml("").replace("pool_size = 12", "pool_size = 1");
    let config = shardq::Config::from_toml(&toml).unwrap();
    let set = shards.migrated(&config).await;
    let shard = set.get(0);
    for (take, label) in [(0, "shardq's pool"), (1, "the user pool")] {
        // Each checkout is dropped at the end of its block: shardq's pool
        // cleans the connection then (the next checkout waits for it), the
        // user pool when it lends it again.
        let pid = if take == 0 {
            set_on(&shard.client().await.unwrap()).await
        } else {
            set_on(&shard.user_client().await.unwrap()).await
        };
        let (again, indexscan, work_mem) = if take == 0 {
            settings_of(&shard.client().await.unwrap()).await
        } else {
            settings_of(&shard.user_client().await.unwrap()).await
        };
        assert_eq!(pid, again, "{label}: the same connection came back");
        assert_eq!(indexscan, "on", "{label}");
        assert_eq!(work_mem, "4MB", "{label}");
    }
    // shardq's own settings survive the cleaning on its own connections.
    let own = shard.client().await.unwrap();
    assert_eq!(show(&own, "enable_seqscan").await, "off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn your_transactions_run_with_your_settings_not_shardqs() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let routed = client
        .route(NewJob::new("q", "noop", serde_json::json!({})))
        .unwrap();
    let mut mine = routed.shard().user_client().await.unwrap();
    for (name, server_default) in [
        ("enable_seqscan", "on"),
        ("enable_hashjoin", "on"),
        ("enable_mergejoin", "on"),
        ("lock_timeout", "0"),
        ("statement_timeout", "0"),
        ("plan_cache_mode", "auto"),
    ] {
        assert_eq!(show(&mine, name).await, server_default, "{name}");
    }
    let tx = mine.transaction().await.unwrap();
    let id = routed.insert(&*tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(client.job(id).await.unwrap().unwrap().status, "queued");

    // A connection that is wholly the user's own works the same way.
    let (plain, connection) = tokio_postgres::connect(&shards.urls[0], tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let routed = client
        .route(NewJob::new("q", "noop", serde_json::json!({})))
        .unwrap();
    let id = routed.insert(&plain).await.unwrap();
    assert_eq!(client.job(id).await.unwrap().unwrap().status, "queued");
}

/// A transaction left open on a connection of shardq's pool (its user
/// dropped it mid-way) is rolled back before the connection is lent again:
/// the next user's statement runs in a transaction of its own, and whatever
/// the open one locked is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_left_open_is_rolled_back_before_the_next_use() {
    let shards = TestShards::databases(1).await;
    let toml = shards.toml("").replace("pool_size = 12", "pool_size = 1");
    let config = shardq::Config::from_toml(&toml).unwrap();
    let set = shards.migrated(&config).await;
    let shard = set.get(0);
    shard
        .client()
        .await
        .unwrap()
        .batch_execute("BEGIN; SELECT pg_advisory_xact_lock(4711)")
        .await
        .unwrap();
    // Lent again only once cleaned (one connection in the pool).
    let next = shard.client().await.unwrap();
    let pid: i32 = next
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let mine = shard.user_client().await.unwrap();
    let state: String = mine
        .query_one("SELECT state FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "idle", "no transaction left open on the connection");
    let free: bool = mine
        .query_one("SELECT pg_try_advisory_lock(4711)", &[])
        .await
        .unwrap()
        .get(0);
    assert!(free, "the open transaction's lock went with it");
}
