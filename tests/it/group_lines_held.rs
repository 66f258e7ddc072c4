//! A claim under group limits while a long transaction holds the xmin
//! horizon: its walk of the groups' heads (shardq_group_heads) and its read
//! of each group's run start at the queue's grouped floor, so the entries
//! of the jobs claimed before it are passed in the index
//! (workflow_status_group_lines) without reading their rows. From the
//! start of each group's line, every job the group ran since the hold
//! began was a row to read, on every claim.

use crate::common;

/// 4,000 claims of one group held, then a claim of 5 (the heads' walk
/// finds the group, its run takes 5) reads few blocks of the table: 90
/// after 3,000 claims in a probe, where the walks from each line's start
/// read 318 (161 for a claim of one, the heads' walk alone); 218-228 here with
/// either walk reading rows below the floor.
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
    // The floor trails the first ready turn by about two moves (250 ms
    // apart at most): brought up to it, whatever this machine's speed.
    for _ in 0..3 {
        crate::ready_floors::move_now(&db).await;
    }
    let (floor, first_turn, head): (i64, i64, i64) = {
        let row = db
            .query_one(
                "SELECT (SELECT floor_turn FROM shardq_group_rounds WHERE queue = 'tenants'), \
                        min(turn), min(turn) FILTER (WHERE status = 'queued') \
                 FROM workflow_status",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(
        (floor, head - first_turn),
        (head, 4000),
        "the floor at the first ready turn, past the 4,000 claimed"
    );

    let tx = db.transaction().await.unwrap();
    let before = common::xact_stat(&tx, "blocks_fetched", &["workflow_status"]).await;
    let claimed = tx
        .query(
            "SELECT id FROM shardq_claim(1, 0, 'tenants', 5, 'w', 60000) WHERE id IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .len();
    let read = common::xact_stat(&tx, "blocks_fetched", &["workflow_status"]).await - before;
    tx.commit().await.unwrap();
    assert_eq!(claimed, 5);
    assert!(
        read <= 150,
        "a claim read {read} blocks of the jobs with 4,000 claims of its group held"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}
