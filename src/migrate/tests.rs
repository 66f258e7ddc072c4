//! The no-transaction runner against a real server: it holds no lock that
//! stops writers while it works, and it rebuilds an index that a failed
//! concurrent build left invalid; and the primary key move of migration 13.

use super::*;
use crate::config::Config;
use crate::shards::ShardSet;
use shardq_local::EphemeralServer;

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
    let message = crate::error_chain::error_chain(&err);
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

/// The columns of `index`, in order.
async fn index_columns(db: &tokio_postgres::Client, index: &str) -> Vec<String> {
    db.query_one(
        "SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i \
         CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) \
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
         WHERE i.indexrelid = $1::text::regclass",
        &[&index],
    )
    .await
    .expect("index columns")
    .get(0)
}

/// Puts the shard back at version 12: the primary key led by the shard key.
const BACK_TO_12: &str = "BEGIN; \
    ALTER TABLE workflow_status DROP CONSTRAINT workflow_status_pkey CASCADE, \
        ADD PRIMARY KEY (shard_key, id); \
    ALTER TABLE workflow_steps ADD FOREIGN KEY (shard_key, workflow_id) \
        REFERENCES workflow_status (shard_key, id) ON DELETE CASCADE; \
    DELETE FROM shardq_migrations WHERE version = 13; \
    COMMIT";

#[tokio::test]
async fn the_primary_key_moves_to_the_id_without_losing_steps_or_waiting_long() {
    let server = EphemeralServer::start().await.expect("server");
    let shards = migrated_shard(&server).await;
    let db = admin(&server).await;
    assert_eq!(
        index_columns(&db, "workflow_status_pkey").await,
        ["id", "shard_key"]
    );
    db.batch_execute(BACK_TO_12).await.expect("back to 12");
    db.batch_execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, payload) \
             SELECT g, 'q', 'h', '{}' FROM generate_series(1, 50) AS g; \
         INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output) \
             SELECT shard_key, id, 'first', 'null' FROM workflow_status",
    )
    .await
    .expect("jobs with steps");

    // A transaction that holds the table: the swap gives up after its lock
    // timeout (instead of queueing every claim behind it), names the
    // migration, and leaves the old key in place.
    let holder = admin(&server).await;
    holder
        .batch_execute("BEGIN; LOCK TABLE workflow_status IN ACCESS SHARE MODE")
        .await
        .expect("hold");
    let err = tokio::time::timeout(std::time::Duration::from_secs(60), migrate_all(&shards))
        .await
        .expect("the swap gives up instead of waiting")
        .expect_err("the swap cannot get its lock");
    let message = crate::error_chain::error_chain(&err);
    assert!(message.contains("0013_primary_key_by_id.sql"), "{message}");
    assert!(message.contains("lock timeout"), "{message}");
    assert_eq!(
        index_columns(&db, "workflow_status_pkey").await,
        ["shard_key", "id"]
    );
    holder.batch_execute("COMMIT").await.expect("release");

    migrate_all(&shards)
        .await
        .expect("migrate once the lock is free");
    assert_eq!(
        index_columns(&db, "workflow_status_pkey").await,
        ["id", "shard_key"]
    );
    let steps_key_valid: bool = db
        .query_one(
            "SELECT convalidated FROM pg_constraint \
             WHERE conname = 'workflow_steps_shard_key_workflow_id_fkey'",
            &[],
        )
        .await
        .expect("constraint")
        .get(0);
    assert!(steps_key_valid);
    // Steps still belong to their jobs: deleting a job deletes its steps, and
    // a step of no job is refused.
    db.batch_execute("DELETE FROM workflow_status WHERE shard_key <= 10")
        .await
        .expect("delete");
    let steps: i64 = db
        .query_one("SELECT count(*) FROM workflow_steps", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(steps, 40);
    let orphan = db
        .batch_execute(
            "INSERT INTO workflow_steps (shard_key, workflow_id, step_name) VALUES (1, 999999, 'x')",
        )
        .await
        .expect_err("a step of no job");
    assert!(crate::error_chain::error_chain(&orphan).contains("foreign key"));

    // Run again (a shard whose record was lost): nothing swapped, and the
    // index the run builds anew is dropped, so the key is not kept twice.
    db.batch_execute("DELETE FROM shardq_migrations WHERE version = 13")
        .await
        .expect("forget 13");
    migrate_all(&shards).await.expect("again");
    let unique_on_id: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_index WHERE indrelid = 'workflow_status'::regclass \
             AND indkey::text = (SELECT indkey::text FROM pg_index \
                                 WHERE indexrelid = 'workflow_status_pkey'::regclass)",
            &[],
        )
        .await
        .expect("indexes")
        .get(0);
    assert_eq!(unique_on_id, 1);
}
