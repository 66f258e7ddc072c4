//! Lease recovery under a held xmin horizon: every job finished since the
//! horizon was held leaves an expired entry in the lease index; a pass
//! that starts at a time no unrecovered lease is before (the lease floor,
//! src/store/upkeep.rs) reads none of them, and still finds the lease that
//! expired since.

use crate::common;

use common::TestShards;
use shardq::store::{sql, upkeep};
use std::time::SystemTime;
use tokio_postgres::types::Type;

/// Lease index entries read by the expired-lease search from `since`, and
/// the jobs it found, in one transaction rolled back.
async fn search(db: &mut tokio_postgres::Client, since: Option<SystemTime>) -> (i64, Vec<i64>) {
    let tx = db.transaction().await.unwrap();
    let before = common::xact_stat(&tx, "tuples_returned", &["workflow_status_lease"]).await;
    let found = tx
        .query_typed(
            sql::JOB_FIND_EXPIRED,
            &[(&100i64, Type::INT8), (&since, Type::TIMESTAMPTZ)],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("id"))
        .collect();
    let read = common::xact_stat(&tx, "tuples_returned", &["workflow_status_lease"]).await - before;
    tx.rollback().await.unwrap();
    (read, found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_pass_from_its_floor_reads_no_expired_entry_behind_it() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let shard = set.get(0);
    let mut db = shard.client().await.unwrap();
    let holder = common::hold_snapshot(&shards.urls[0]).await;

    // 2,000 jobs claimed with leases that end at once, then finished: their
    // running versions stay, dead but kept for the snapshot.
    db.batch_execute(
        "INSERT INTO workflow_status (shard_key, queue, handler) \
         SELECT g % 65536, 'q', 'noop' FROM generate_series(1, 2000) g; \
         SELECT count(*) FROM shardq_claim(1, 0, 'q', 2000, 'w', 0); \
         UPDATE workflow_status SET status = 'succeeded', finished_at = now() \
         WHERE status = 'running'",
    )
    .await
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let floor: SystemTime = db.query_one("SELECT now()", &[]).await.unwrap().get(0);
    // A worker's job whose lease ended after that (its worker died).
    let lost: i64 = db
        .query_one(
            "WITH j AS (INSERT INTO workflow_status (shard_key, queue, handler) \
                VALUES (1, 'lost', 'noop') RETURNING id) \
             SELECT id FROM j",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    db.execute("SELECT * FROM shardq_claim(1, 0, 'lost', 1, 'w', 0)", &[])
        .await
        .unwrap();

    let (read, found) = search(&mut db, None).await;
    assert_eq!(found, vec![lost]);
    assert!(
        read >= 2_000,
        "from the oldest lease it read {read} entries"
    );
    let (read, found) = search(&mut db, Some(floor)).await;
    assert_eq!(found, vec![lost]);
    assert!(read <= 5, "from the floor it read {read} entries");

    let pass = upkeep::recover(shard, 100, upkeep::RecoveryStart::At(floor))
        .await
        .unwrap();
    assert_eq!(pass.recovered.requeued, 1);
    assert!(pass.caught_up && pass.at.is_some() && pass.oldest_left.is_none());
    holder.batch_execute("COMMIT").await.unwrap();
}
