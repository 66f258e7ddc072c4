//! Session state leaks neither way. A `SET` made on a pooled connection does
//! not reach the statements that use the connection next (before, it stayed
//! for every later claim), and shardq's own settings (index-only plans,
//! `lock_timeout`, `statement_timeout`) never reach your statements:
//! transactional enqueue runs on a connection of your own or on
//! `Shard::user_client`, which carries the server's settings.

mod common;

use common::TestShards;
use shardq::{Client, NewJob};

async fn show(client: &deadpool_postgres::Client, name: &str) -> String {
    client
        .query_one(&format!("SHOW {name}"), &[])
        .await
        .unwrap()
        .get(0)
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
        let first = if take == 0 {
            shard.client().await.unwrap()
        } else {
            shard.user_client().await.unwrap()
        };
        let pid: i32 = first
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        first
            .batch_execute("SET enable_indexscan = off; SET work_mem = '64kB'")
            .await
            .unwrap();
        drop(first);
        let next = if take == 0 {
            shard.client().await.unwrap()
        } else {
            shard.user_client().await.unwrap()
        };
        let again: i32 = next
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(pid, again, "{label}: the same connection came back");
        assert_eq!(show(&next, "enable_indexscan").await, "on", "{label}");
        assert_eq!(show(&next, "work_mem").await, "4MB", "{label}");
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
