//! `store::schema`: versions and the shard map a shard records.

use crate::common;

use common::TestShards;
use shardq::config::Config;
use shardq::shards::ShardSet;
use shardq::store::schema;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_reads_versions_and_shard_map_and_create_database_is_idempotent() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("");
    let set = ShardSet::connect(&config).unwrap();
    let (migrated, fresh) = (set.get(0), set.get(1));
    shardq::migrate::migrate_shard(migrated, 2).await.unwrap();

    let latest = shardq::migrate::latest_version();
    assert_eq!(
        schema::current_version(migrated).await.unwrap(),
        Some(latest)
    );
    assert_eq!(
        schema::applied(migrated).await.unwrap(),
        // Versions may skip numbers (reserved by branches merged later).
        shardq::migrate::MIGRATIONS
            .iter()
            .map(|m| m.version)
            .collect::<Vec<_>>()
    );
    assert_eq!(schema::shard_map(migrated).await.unwrap(), Some((2, 0)));

    assert_eq!(schema::current_version(fresh).await.unwrap(), None);
    assert!(schema::applied(fresh).await.unwrap().is_empty());
    assert_eq!(schema::shard_map(fresh).await.unwrap(), None);
    shardq::migrate::migrate_shard(fresh, 2).await.unwrap();
    assert_eq!(schema::shard_map(fresh).await.unwrap(), Some((2, 1)));

    // create_database, twice, with a name that needs quoting.
    let name = "store \"new\" db";
    for _ in 0..2 {
        shardq_local::create_database(&shards.servers[0].admin_url(), name)
            .await
            .expect("create database (again)");
    }
    let (admin, connection) =
        tokio_postgres::connect(&shards.servers[0].admin_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    let n: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    // The new database is a fresh shard: no schema.
    let fresh_config = Config::from_toml(&format!(
        "[[shards]]\nname = \"n\"\nurl = \"{}\"\n",
        shards.urls[0].rsplit_once('/').unwrap().0.to_string() + "/store%20%22new%22%20db"
    ))
    .unwrap();
    let fresh_set = ShardSet::connect(&fresh_config).unwrap();
    assert_eq!(
        schema::current_version(fresh_set.get(0)).await.unwrap(),
        None
    );
    drop(admin);
    let _ = connection.await;
}
