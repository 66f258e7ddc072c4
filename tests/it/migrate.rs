//! Migrations are idempotent and safe when several processes run them at once.

use crate::common;

use common::TestShards;
use shardq::migrate;
use shardq::shards::ShardSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_run_twice_and_concurrently_without_error() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("");
    // Four "processes": separate pools, racing on fresh databases.
    let runs = (0..4).map(|_| {
        let set = ShardSet::connect(&config).unwrap();
        async move { migrate::migrate_all(&set).await }
    });
    let results = futures_util::future::join_all(runs).await;
    let mut applied_total = 0;
    for r in results {
        let applied = r.expect("concurrent migrate succeeds");
        applied_total += applied.iter().map(Vec::len).sum::<usize>();
    }
    let expected = migrate::MIGRATIONS.len() * 2;
    assert_eq!(
        applied_total, expected,
        "each migration applied once per shard"
    );

    let set = ShardSet::connect(&config).unwrap();
    let again = migrate::migrate_all(&set).await.unwrap();
    assert!(
        again.iter().all(Vec::is_empty),
        "second run applies nothing"
    );
    migrate::check_all(&set).await.expect("schema is current");
    for shard in set.all() {
        let n: i64 = shard
            .client()
            .await
            .unwrap()
            .query_one("SELECT count(*) FROM shardq_migrations", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n as usize, migrate::MIGRATIONS.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_an_unmigrated_or_newer_schema() {
    let shards = TestShards::databases(1).await;
    let set = ShardSet::connect(&shards.config("")).unwrap();
    let e = migrate::check_all(&set).await.unwrap_err();
    assert!(e.to_string().contains("run `shardq migrate`"), "{e}");
    migrate::migrate_all(&set).await.unwrap();
    set.get(0)
        .client()
        .await
        .unwrap()
        .execute(
            "INSERT INTO shardq_migrations (version, name) VALUES (999, 'future')",
            &[],
        )
        .await
        .unwrap();
    let e = migrate::check_all(&set).await.unwrap_err();
    assert!(e.to_string().contains("newer than this binary"), "{e}");
}
