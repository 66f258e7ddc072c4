//! The no-transaction runner against a real server: it holds no lock that
//! stops writers while it works, and it rebuilds an index that a failed
//! concurrent build left invalid.

use super::*;
use crate::config::Config;
use crate::local::EphemeralServer;

async fn migrated_shard(server: &EphemeralServer) -> ShardSet {
    let toml = format!(
        "[[shards]]\nname = \"s0\"\nurl = \"{}\"\npool_size = 4\n",
        server.url()
    );
    let config = Config::from_toml(&toml).expect("config");
    let shards = ShardSet::connect(&config).expect("connect");
    migrate_all(&shards).await.expect("migrate");
    shards
}

async fn admin(server: &EphemeralServer) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

const CONCURRENT: Migration = Migration {
    version: 1000,
    name: "1000_test_concurrent.sql",
    sql: "-- shardq:no-transaction\n\
          CREATE INDEX CONCURRENTLY IF NOT EXISTS test_by_handler ON workflow_status (handler);\n\
          SELECT pg_advisory_lock(4242);\n\
          SELECT pg_advisory_unlock(4242);\n",
};

#[tokio::test]
async fn a_no_transaction_migration_lets_writers_through_while_it_runs() {
    let server = EphemeralServer::start().await.expect("server");
    let shards = migrated_shard(&server).await;
    let test = admin(&server).await;
    // Pause the migration after its index build: it waits for this lock.
    test.execute("SELECT pg_advisory_lock(4242)", &[])
        .await
        .expect("lock");
    let shard = shards.get(0).clone();
    let migration = tokio::spawn(async move { no_transaction::apply(&shard, &CONCURRENT).await });
    let writer = admin(&server).await;
    let paused = async {
        loop {
            let waiting: i64 = writer
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                     AND objid = 4242 AND NOT granted",
                    &[],
                )
                .await
                .expect("locks")
                .get(0);
            if waiting > 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), paused)
        .await
        .expect("the migration reached its pause");
    // Mid-migration: the index is built and valid, no lock is held on the
    // table, and a write goes through at once.
    let table_locks: i64 = writer
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE relation = 'workflow_status'::regclass",
            &[],
        )
        .await
        .expect("locks")
        .get(0);
    assert_eq!(table_locks, 0, "the migration holds a lock on the table");
    writer
        .batch_execute(
            "SET lock_timeout = '200ms'; \
             INSERT INTO workflow_status (shard_key, queue, handler, payload) \
             VALUES (1, 'q', 'h', '{}')",
        )
        .await
        .expect("a write goes through while the migration runs");
    test.execute("SELECT pg_advisory_unlock(4242)", &[])
        .await
        .expect("unlock");
    let applied = migration.await.expect("join").expect("migration");
    assert!(applied);
    let valid: bool = writer
        .query_one(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'test_by_handler'::regclass",
            &[],
        )
        .await
        .expect("index")
        .get(0);
    assert!(valid);
    let recorded: i64 = writer
        .query_one(
            "SELECT count(*) FROM shardq_migrations WHERE version = 1000",
            &[],
        )
        .await
        .expect("record")
        .get(0);
    assert_eq!(recorded, 1);
    // Run again: applied already, nothing done.
    assert!(!no_transaction::apply(shards.get(0), &CONCURRENT)
        .await
        .expect("again"));
}

const UNIQUE: Migration = Migration {
    version: 1001,
    name: "1001_test_unique.sql",
    sql: "-- shardq:no-transaction\n\
          CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS test_unique_handler ON workflow_status (handler);\n",
};

#[tokio::test]
async fn a_failed_concurrent_build_is_rebuilt_on_the_next_run() {
    let server = EphemeralServer::start().await.expect("server");
    let shards = migrated_shard(&server).await;
    let test = admin(&server).await;
    test.batch_execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, payload) \
         VALUES (1, 'q', 'same', '{}'), (2, 'q', 'same', '{}')",
    )
    .await
    .expect("rows");
    let shard = shards.get(0);
    let err = no_transaction::apply(shard, &UNIQUE)
        .await
        .expect_err("duplicates fail the unique build");
    let message = crate::error_chain(&err);
    assert!(message.contains("1001_test_unique.sql"), "{message}");
    assert!(message.contains("CREATE UNIQUE INDEX"), "{message}");
    let invalid: bool = test
        .query_one(
            "SELECT NOT indisvalid FROM pg_index WHERE indexrelid = 'test_unique_handler'::regclass",
            &[],
        )
        .await
        .expect("index")
        .get(0);
    assert!(invalid, "a failed concurrent build leaves an invalid index");
    // Fix the data, run again: the invalid index is dropped and built anew
    // (IF NOT EXISTS alone would keep the invalid one).
    test.batch_execute("UPDATE workflow_status SET handler = 'other' WHERE shard_key = 2")
        .await
        .expect("fix");
    assert!(no_transaction::apply(shard, &UNIQUE)
        .await
        .expect("second run"));
    let valid: bool = test
        .query_one(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'test_unique_handler'::regclass",
            &[],
        )
        .await
        .expect("index")
        .get(0);
    assert!(valid);
}
