//! A claim under group limits while a long transaction holds the xmin
//! horizon: its walk of the groups' heads (shardq_group_heads) and its read
//! of each group's run start at the queue's grouped floor, so the entries
//! of the jobs claimed before it are passed in the index
//! (workflow_status_group_lines) without reading their rows. From the
//! start of each group's line, every job the group ran since the hold
//! began was a row to read, on every claim.

use crate::common;

/// Blocks of the jobs' table this transaction has read.
async fn heap_blocks(tx: &tokio_postgres::Transaction<'_>) -> i64 {
    tx.query_one(
        "SELECT pg_stat_get_xact_blocks_fetched('workflow_status'::regclass)",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// 4,000 claims of one group held, then a claim of 5 (the heads' walk
/// finds the group, its run takes 5) reads few blocks of the table: 90
/// after 3,000 claims in a probe, where the walks from each line's start
/// read 318 (161 for a claim of one, the heads' walk alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_limited_claim_under_a_held_snapshot_starts_at_the_grouped_floor() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let mut db = set.get(0).client().await.unwrap();
    // A group rate so high that it never holds a job back.
    db.batch_execute(
        "INSERT INTO shardq_queue_limits (queue, group_rate_count, group_rate_period_ms, revision) \
         VALUES ('tenants', 100000000, 1000, 1); \
         SELECT shardq_enqueue('tenants', 'noop', p_group => 'g') FROM generate_series(1, 4100)",
    )
    .await
    .unwrap();
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    for _ in 0..4000 {
        let claimed = db
            .query(
                "SELECT id FROM shardq_claim(1, 0, 'tenants', 1, 'w', 60000) WHERE id IS NOT NULL",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
    }
    let floor: i64 = db
        .query_one(
            "SELECT floor_turn FROM shardq_group_rounds WHERE queue = 'tenants'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let first_turn: i64 = db
        .query_one("SELECT min(turn) FROM workflow_status", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        floor > first_turn + 3000,
        "the floor moved past most of what was claimed: {first_turn} -> {floor}"
    );

    let tx = db.transaction().await.unwrap();
    let before = heap_blocks(&tx).await;
    let claimed = tx
        .query(
            "SELECT id FROM shardq_claim(1, 0, 'tenants', 5, 'w', 60000) WHERE id IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .len();
    let read = heap_blocks(&tx).await - before;
    tx.commit().await.unwrap();
    assert_eq!(claimed, 5);
    assert!(
        read <= 150,
        "a claim read {read} blocks of the jobs with 4,000 claims of its group held"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}
