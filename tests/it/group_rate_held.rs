//! A group rate's buckets while a long transaction holds the xmin horizon
//! (migration 50): a grouped claim that takes from a group adds the
//! bucket's next row and deletes the one it read, so the next claim reads
//! the newest row first however many replaced ones the hold keeps (one row
//! per group, upserted by every claim, made each read walk every version
//! kept: bench/experiments/limits_versions.py --group). And the upgrade's
//! two races: a claim of the old text that already wrote the old bucket
//! has its write copied; one that waited for the migration's lock fails
//! instead of writing where no one reads.

use crate::common;
use shardq::shards::ShardSet;

const QUEUE: &str = "tenants";
const CLAIM_ONE: &str =
    "SELECT id FROM shardq_claim(1, 0, 'tenants', 1, 'w', 60000) WHERE id IS NOT NULL";

/// The group buckets and their key.
const BUCKETS: [&str; 2] = ["shardq_group_buckets", "shardq_group_buckets_pkey"];

/// `n` ready jobs of group `group` in the queue, and a group rate of
/// `count` starts per `period_ms`.
async fn grouped_jobs(
    db: &tokio_postgres::Client,
    group: &str,
    n: i32,
    count: i32,
    period_ms: i32,
) {
    db.execute(
        "INSERT INTO shardq_queue_limits (queue, group_rate_count, group_rate_period_ms, revision) \
         VALUES ($1, $2, $3, 1)",
        &[&QUEUE, &count, &period_ms],
    )
    .await
    .unwrap();
    db.execute(
        "SELECT shardq_enqueue($1, 'noop', p_group => $3) FROM generate_series(1, $2)",
        &[&QUEUE, &n, &group],
    )
    .await
    .unwrap();
}

/// 5,000 claims of one group under a held snapshot (each takes one job
/// from its bucket, so each writes it) leave one bucket row, and the next
/// claim reads and writes few blocks of the buckets (13 here, 13-15 after
/// 500 to 20,000 claims, 9 after one; one row upserted by every claim,
/// before migration 50: 6 after one, 34 after 2,000, 78 after 5,000, 152
/// after 10,000), and still takes from the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grouped_claim_under_a_held_snapshot_reads_the_groups_newest_bucket_row_first() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let mut db = set.get(0).client().await.unwrap();
    // A rate so high that every claim takes a job, and so writes.
    grouped_jobs(&db, "g", 5001, 100_000_000, 1000).await;
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    for _ in 0..5000 {
        assert_eq!(db.query(CLAIM_ONE, &[]).await.unwrap().len(), 1);
    }
    let rows: i64 = db
        .query_one("SELECT count(*) FROM shardq_group_buckets", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "each claim replaced the group's bucket row");
    db.batch_execute("ANALYZE shardq_group_buckets")
        .await
        .unwrap();

    let tx = db.transaction().await.unwrap();
    let before = common::xact_stat(&tx, "blocks_fetched", &BUCKETS).await;
    let claimed = tx.query(CLAIM_ONE, &[]).await.unwrap().len();
    let read = common::xact_stat(&tx, "blocks_fetched", &BUCKETS).await - before;
    tx.commit().await.unwrap();
    assert_eq!(claimed, 1);
    assert!(
        read <= 26,
        "a claim read {read} blocks of the group buckets with 5,000 claims held"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// The bucket a claim leaves is the one the next reads (one start an hour:
/// none after the first within the test), upkeep keeps an empty bucket and
/// forgets a full one not taken from for 10 minutes, and the group's next
/// row numbers past the one forgotten: a backward walk of the key meets it
/// before the dead rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_claim_of_a_group_reads_what_the_last_one_left() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let db = set.get(0).client().await.unwrap();
    grouped_jobs(&db, "g", 3, 1, 3_600_000).await;
    assert_eq!(db.query(CLAIM_ONE, &[]).await.unwrap().len(), 1);
    assert_eq!(
        db.query(CLAIM_ONE, &[]).await.unwrap().len(),
        0,
        "1 an hour"
    );
    let newest = "SELECT max(take_seq) FROM shardq_group_buckets";
    let first: i64 = db.query_one(newest, &[]).await.unwrap().get(0);
    shardq::store::upkeep::forget_full_buckets(set.get(0), 100)
        .await
        .unwrap();
    assert_eq!(db.query(CLAIM_ONE, &[]).await.unwrap().len(), 0, "kept");

    db.batch_execute(
        "UPDATE shardq_queue_limits SET group_rate_count = 1000, group_rate_period_ms = 1000; \
         UPDATE shardq_group_buckets SET tokens_at = now() - interval '11 minutes'",
    )
    .await
    .unwrap();
    let forgotten = shardq::store::upkeep::forget_full_buckets(set.get(0), 100)
        .await
        .unwrap();
    let left: i64 = db
        .query_one("SELECT count(*) FROM shardq_group_buckets", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        (forgotten, left),
        (1, 0),
        "the full, quiet bucket forgotten"
    );
    assert_eq!(db.query(CLAIM_ONE, &[]).await.unwrap().len(), 1, "full");
    let next: i64 = db.query_one(newest, &[]).await.unwrap().get(0);
    assert!(next > first, "{first} -> {next}");
}

/// A test shard back at version 49: the old buckets' table, and 50 to run.
async fn at_49(set: &ShardSet) {
    set.get(0)
        .client()
        .await
        .unwrap()
        .batch_execute(
            "DROP TABLE shardq_group_buckets; DROP SEQUENCE shardq_group_bucket_seq; \
             CREATE TABLE shardq_group_tokens (queue text NOT NULL, job_group text NOT NULL, \
                 tokens double precision NOT NULL, tokens_at timestamptz NOT NULL, \
                 PRIMARY KEY (queue, job_group)); \
             DELETE FROM shardq_migrations WHERE version = 50",
        )
        .await
        .unwrap();
}

/// The tokens of group `g`'s bucket in the test queue after migration 50:
/// its one row.
async fn copied_tokens(set: &ShardSet) -> f64 {
    set.get(0)
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT tokens FROM shardq_group_buckets WHERE queue = 'tenants' AND job_group = 'g'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// An old claim's write of a bucket, not yet committed when migration 50
/// starts: the migration waits for it (the old table's lock) and copies
/// what it wrote, so the start it took still counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_claims_bucket_write_before_migration_50_is_copied() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    at_49(&set).await;
    let mut old = set.get(0).client().await.unwrap();
    let old_claim = old.transaction().await.unwrap();
    old_claim
        .batch_execute(
            "INSERT INTO shardq_group_tokens AS b (queue, job_group, tokens, tokens_at) \
             VALUES ('tenants', 'g', 0.25, now()) ON CONFLICT (queue, job_group) \
             DO UPDATE SET tokens = EXCLUDED.tokens, tokens_at = EXCLUDED.tokens_at",
        )
        .await
        .unwrap();
    let migrating = {
        let set = set.clone();
        tokio::spawn(async move { shardq::migrate::migrate_all(&set).await })
    };
    common::until_lock_wait(set.get(0), "the migration waits for the old claim").await;
    old_claim.commit().await.unwrap();
    migrating.await.unwrap().expect("migrate");
    let copied = copied_tokens(&set).await;
    assert_eq!(copied, 0.25);
}

/// An old claim (a plpgsql function, its plan cached by an earlier call,
/// as a worker's connection has it) that reaches the bucket's read while
/// migration 50 holds the old table waits, and fails once the migration
/// commits (the table is gone): it writes nothing where no one reads it,
/// and its worker claims again with the new text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_claim_that_waited_for_migration_50_fails_instead_of_writing() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    at_49(&set).await;
    let old = set.get(0).client().await.unwrap();
    old.batch_execute(
        "CREATE FUNCTION old_claim_bucket() RETURNS double precision LANGUAGE plpgsql AS $$ \
         DECLARE t double precision; BEGIN \
             SELECT b.tokens INTO t FROM shardq_group_tokens b \
                 WHERE b.queue = 'tenants' AND b.job_group = 'g'; \
             INSERT INTO shardq_group_tokens AS b (queue, job_group, tokens, tokens_at) \
                 VALUES ('tenants', 'g', coalesce(t, 1) - 1, now()) \
                 ON CONFLICT (queue, job_group) DO UPDATE SET tokens = EXCLUDED.tokens; \
             RETURN t; END $$; \
         SELECT old_claim_bucket()",
    )
    .await
    .unwrap();

    let mut migration = set.get(0).client().await.unwrap();
    let tx = migration.transaction().await.unwrap();
    tx.batch_execute(include_str!(
        "../../migrations/0050_group_buckets_as_moves.sql"
    ))
    .await
    .unwrap();
    let claim = tokio::spawn(async move { old.query_one("SELECT old_claim_bucket()", &[]).await });
    common::until_lock_wait(set.get(0), "the old claim waits for the migration").await;
    tx.commit().await.unwrap();
    let refused = claim.await.unwrap().expect_err("the resumed old claim");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE),
        "{refused}"
    );
    let copied = copied_tokens(&set).await;
    assert_eq!(
        copied, 0.0,
        "the first old claim's write, copied; nothing since"
    );
}
