//! A keyed claim reads and locks only the runs it can take
//! (migrations/functions/shardq_claim_keyed.sql): it meets up to a claim's
//! worth of key heads, but stops reading the keys' jobs once it met a
//! claim's worth it can take. A run cut by another transaction's row lock
//! counts for nothing, so the claim goes on to the next key's run.

use super::ready_floors::{claim, shard};
use shardq::shards::ShardSet;
use tokio_postgres::GenericClient;

/// Inserts `n` ready jobs of key `key` in queue `q`; returns their ids.
async fn enqueue(db: &impl GenericClient, key: &str, n: i64) -> Vec<i64> {
    db.query(
        "INSERT INTO workflow_status (shard_key, queue, handler, ordering_key) \
         SELECT 7, 'q', 'noop', $1 FROM generate_series(1, $2::bigint) RETURNING id",
        &[&key, &n],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Entries of the key index returned in this transaction so far.
async fn entries_read(tx: &impl GenericClient) -> i64 {
    tx.query_one(
        "SELECT pg_stat_get_xact_tuples_returned('workflow_status_key'::regclass)::bigint",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Jobs of queue `q` locked by a claim, with what it read and locked:
/// the ids claimed, entries of the key index returned and rows locked.
async fn claim_counting(set: &ShardSet, limit: i32) -> (Vec<i64>, i64, i64) {
    let mut db = set.get(0).client().await.unwrap();
    let tx = db.transaction().await.unwrap();
    let read_before = entries_read(&*tx).await;
    let claimed: Vec<i64> = tx
        .query(super::ready_floors::CLAIM, &[&"q", &limit])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let read = entries_read(&*tx).await - read_before;
    // Rows this transaction locked and did not update: their xmax is its
    // id, their status unchanged (an update leaves a new version instead).
    let locked: i64 = tx
        .query_one(
            "SELECT count(*) FROM workflow_status \
             WHERE queue = 'q' AND status = 'queued' AND xmax = pg_current_xact_id()::xid",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    tx.commit().await.unwrap();
    (claimed, read, locked)
}

/// Forty keys with twenty jobs each: a claim of thirty meets thirty keys'
/// heads, takes the first key's run and ten jobs of the second, and reads
/// no other key's jobs. Reading every met key's run (as claims did before)
/// returned 640 entries of the key index and left 560 rows locked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_reads_only_the_runs_it_takes() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    // Enqueued round by round, as keys' jobs usually arrive: the ready
    // order meets every key's head before any key's second job.
    let mut runs = vec![Vec::new(); 40];
    for _ in 0..20 {
        for (key, run) in runs.iter_mut().enumerate() {
            run.extend(enqueue(&***db, &format!("k{key}"), 1).await);
        }
    }
    let (claimed, read, locked) = claim_counting(&set, 30).await;
    let mut expected = runs[0].clone();
    expected.extend(&runs[1][..10]);
    expected.sort();
    assert_eq!(claimed, expected, "the first run, then the second cut");
    assert_eq!(
        locked, 28,
        "jobs locked and left: only the heads of the 28 keys met and not taken"
    );
    assert!(
        read <= 120,
        "the claim read {read} entries of the key index (two runs of 20, and their parking)"
    );
    // The second key's other jobs were parked; finished, its run goes on
    // at the next of them.
    let rest: Vec<i64> = runs[1][10..].to_vec();
    let statuses = |ids: Vec<i64>| {
        let db = &db;
        async move {
            db.query(
                "SELECT status FROM workflow_status WHERE id = ANY($1) ORDER BY id",
                &[&ids],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
        }
    };
    assert_eq!(statuses(rest.clone()).await, vec!["waiting"; 10]);
    db.execute(
        "UPDATE workflow_status SET status = 'succeeded' WHERE id = ANY($1)",
        &[&expected],
    )
    .await
    .unwrap();
    db.execute(
        "SELECT shardq_promote_keys(ARRAY[7, 7], ARRAY[$1::bigint, $2::bigint])",
        &[&runs[0][19], &runs[1][9]],
    )
    .await
    .unwrap();
    let mut after = vec!["queued"];
    after.extend(vec!["waiting"; 9]);
    assert_eq!(statuses(rest).await, after);
}

/// Key `a` has jobs a1 < a2 and key `b` one job b1, ready in that order.
/// Another transaction holds a row lock on a1. A claim of two meets a2
/// and b1 as heads: `a`'s run is cut before a1, so it offers nothing, and
/// the claim takes b1. (Counting a cut run's rows against the claim's
/// limit, it took nothing.) Once the lock goes, a1 and a2 run in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_by_another_transaction_leaves_the_claim_to_the_next_key() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    let mut other = set.get(0).client().await.unwrap();
    let a = enqueue(&***db, "a", 2).await;
    let b = enqueue(&***db, "b", 1).await;
    let lock = other.transaction().await.unwrap();
    lock.execute(
        "SELECT 1 FROM workflow_status WHERE id = $1 FOR UPDATE",
        &[&a[0]],
    )
    .await
    .unwrap();
    assert_eq!(claim(&db, "q", 2).await, b, "b's run is taken");
    lock.commit().await.unwrap();
    assert_eq!(claim(&db, "q", 10).await, a, "a's run, in order");
}
