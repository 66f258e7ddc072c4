//! A queue rate's token bucket while a long transaction holds the xmin
//! horizon (migration 48): takes add the bucket's new row and delete the
//! one they read, so a take reads the newest row first however many
//! replaced ones the hold keeps (the bucket in the limits row, updated by
//! every take, made each read walk every version: 0.3 ms a take at the
//! start of a hold, 2.4 after 50,000 takes, bench/experiments/limits_versions.py).

use crate::common;

/// Heap and index blocks of the limits row and the bucket this transaction
/// has read so far.
async fn blocks(tx: &tokio_postgres::Transaction<'_>) -> i64 {
    tx.query_one(
        "SELECT sum(pg_stat_get_xact_blocks_fetched(r::regclass))::int8 FROM unnest(array[ \
             'shardq_queue_limits', 'shardq_queue_limits_pkey', \
             'shardq_rate_buckets', 'shardq_rate_buckets_pkey']) r",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

const TAKE: &str = "SELECT shardq_take_starts('rated', 50)";

/// 2,000 takes under a held snapshot leave one bucket row, and the next
/// take reads few blocks of the limits row and the bucket (20 here, 16
/// at the start of a hold and 20 after 10,000 takes; the bucket in the
/// limits row, before migration 48, read 69 blocks after 2,000 takes and
/// 150 after 10,000), and still gives what the bucket holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_under_a_held_snapshot_reads_the_buckets_newest_row_first() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let mut db = set.get(0).client().await.unwrap();
    // A rate so high that every take is granted, and so writes.
    db.batch_execute(
        "INSERT INTO shardq_queue_limits (queue, rate_count, rate_period_ms, revision) \
         VALUES ('rated', 100000000, 1000, 1)",
    )
    .await
    .unwrap();
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    for _ in 0..2000 {
        let starts: i32 = db.query_one(TAKE, &[]).await.unwrap().get(0);
        assert_eq!(starts, 50);
    }
    let rows: i64 = db
        .query_one("SELECT count(*) FROM shardq_rate_buckets", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "each take replaced the bucket's row");
    db.batch_execute("ANALYZE shardq_rate_buckets, shardq_queue_limits")
        .await
        .unwrap();

    let tx = db.transaction().await.unwrap();
    let before = blocks(&tx).await;
    let starts: i32 = tx.query_one(TAKE, &[]).await.unwrap().get(0);
    let read = blocks(&tx).await - before;
    tx.commit().await.unwrap();
    assert_eq!(starts, 50);
    assert!(
        read <= 32,
        "a take read {read} blocks of the limits row and the bucket with 2,000 takes held"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// The bucket a take leaves is the one the next take reads: starts given
/// back return to it, and a queue whose bucket is empty gets none until
/// its rate refills it (one start a second here: none within the test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_take_reads_what_the_last_one_left() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let db = set.get(0).client().await.unwrap();
    // One start a second, a burst of 1; the bucket starts full by the
    // limits row's tokens (the state before migration 48).
    db.batch_execute(
        "INSERT INTO shardq_queue_limits (queue, rate_count, rate_period_ms, revision, tokens) \
         VALUES ('slow', 1, 1000, 1, 1)",
    )
    .await
    .unwrap();
    let take = |want: i32| {
        let db = &db;
        async move {
            db.query_one("SELECT shardq_take_starts('slow', $1)", &[&want])
                .await
                .unwrap()
                .get::<_, i32>(0)
        }
    };
    assert_eq!(take(1).await, 1, "the limits row's token");
    assert_eq!(take(1).await, 0, "taken: the bucket is empty");
    assert_eq!(take(-1).await, -1, "given back");
    assert_eq!(take(1).await, 1, "the start given back");
    assert_eq!(take(1).await, 0);
    let rows: i64 = db
        .query_one("SELECT count(*) FROM shardq_rate_buckets", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);
}
