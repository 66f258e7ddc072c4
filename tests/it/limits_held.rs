//! Queue limits while a long transaction holds the xmin horizon
//! (migration 48): a rate's token bucket and each process's lease of a
//! queue's permits are rows only added and deleted, so a take or a renewal
//! reads the newest rows first however many replaced ones the hold keeps
//! (the bucket in the limits row and the lease in one row each, updated by
//! every take and renewal, made each read walk every version kept:
//! bench/experiments/limits_versions.py).

use crate::common;

/// Heap and index blocks of the limits' tables this transaction has read
/// so far.
async fn blocks(tx: &tokio_postgres::Transaction<'_>) -> i64 {
    tx.query_one(
        "SELECT sum(pg_stat_get_xact_blocks_fetched(r::regclass))::int8 FROM unnest(array[ \
             'shardq_queue_limits', 'shardq_queue_limits_pkey', \
             'shardq_rate_buckets', 'shardq_rate_buckets_pkey', \
             'shardq_limit_holders', 'shardq_limit_holders_pkey', \
             'shardq_limit_lease_moves', 'shardq_limit_lease_moves_pkey']) r",
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
/// its rate refills it (one start an hour here: none within the test).
/// Takes no longer write the limits row: a write of its bucket columns,
/// as the take before migration 48 made, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_take_reads_what_the_last_one_left() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let db = set.get(0).client().await.unwrap();
    // One start an hour, a burst of 1; the bucket starts full by the
    // limits row's tokens (the state before migration 48).
    db.batch_execute(
        "INSERT INTO shardq_queue_limits (queue, rate_count, rate_period_ms, revision, tokens) \
         VALUES ('slow', 1, 3600000, 1, 1)",
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
    let old_take = db
        .batch_execute("UPDATE shardq_queue_limits SET tokens = 1 WHERE queue = 'slow'")
        .await
        .expect_err("a write of the old bucket");
    assert_eq!(
        old_take.code(),
        Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE),
        "{old_take}"
    );
}

fn renew(holder: usize) -> String {
    format!(
        "SELECT granted FROM shardq_lease_permits('h{holder}', ARRAY['capped'], ARRAY[10], 5000)"
    )
}

/// 8 processes renewing their leases 600 times each under a held snapshot
/// (an hour's renewals of one process every 500 ms is 7,200) leave one
/// lease row a holder, and the next renewal reads few blocks of the
/// limits' tables (36 here, after 250 and 900 renewals each alike; a
/// lease in one row updated by every renewal, before migration 48: 46
/// blocks after 250, 107 after 900), and still grants what the others
/// left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_under_a_held_snapshot_reads_each_holders_newest_lease_first() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let mut db = set.get(0).client().await.unwrap();
    db.batch_execute(
        "INSERT INTO shardq_queue_limits (queue, concurrency, revision) VALUES ('capped', 85, 1)",
    )
    .await
    .unwrap();
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    for _ in 0..600 {
        for h in 0..8 {
            let granted: i32 = db.query_one(&renew(h), &[]).await.unwrap().get(0);
            assert_eq!(granted, 10, "holder {h}");
        }
    }
    let rows: i64 = db
        .query_one("SELECT count(*) FROM shardq_limit_lease_moves", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 8, "each renewal replaced its holder's row");
    db.batch_execute("ANALYZE shardq_limit_lease_moves, shardq_limit_holders")
        .await
        .unwrap();

    let tx = db.transaction().await.unwrap();
    let before = blocks(&tx).await;
    let granted: i32 = tx.query_one(&renew(8), &[]).await.unwrap().get(0);
    let read = blocks(&tx).await - before;
    tx.commit().await.unwrap();
    assert_eq!(granted, 5, "85 less the 80 the others hold");
    assert!(
        read <= 48,
        "a renewal read {read} blocks of the limits' tables with 4,800 renewals held"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// A lease that lapses gives its permits back to the others, and its
/// holder goes with it; one renewed keeps them. A holder back after its
/// lease lapsed numbers its lease past its old rows, so that its newest
/// row is still the first a backward walk of its key meets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_goes_with_its_holder_and_its_permits_come_back() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let db = set.get(0).client().await.unwrap();
    db.batch_execute(
        "INSERT INTO shardq_queue_limits (queue, concurrency, revision) VALUES ('capped', 5, 1)",
    )
    .await
    .unwrap();
    let lease = |holder: &'static str, want: i32, ms: i32| {
        let db = &db;
        async move {
            db.query_one(
                "SELECT granted FROM shardq_lease_permits($1, ARRAY['capped'], ARRAY[$2::int], $3)",
                &[&holder, &want, &ms],
            )
            .await
            .unwrap()
            .get::<_, i32>(0)
        }
    };
    assert_eq!(lease("short", 3, 200).await, 3);
    assert_eq!(
        lease("long", 5, 60_000).await,
        2,
        "what the short lease left"
    );
    assert_eq!(lease("long", 5, 60_000).await, 2, "renewed: still held");
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(
        lease("long", 5, 60_000).await,
        5,
        "the lapsed lease's permits"
    );
    let holders: Vec<String> = db
        .query(
            "SELECT holder FROM shardq_limit_holders ORDER BY holder",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(holders, ["long"]);
    let in_use = db
        .query_one("SELECT permits, holders FROM shardq_permits_in_use()", &[])
        .await
        .unwrap();
    assert_eq!((in_use.get::<_, i64>(0), in_use.get::<_, i64>(1)), (5, 1));

    let newest = "SELECT max(renewal_seq) FROM shardq_limit_lease_moves";
    let before: i64 = db.query_one(newest, &[]).await.unwrap().get(0);
    assert_eq!(lease("short", 3, 200).await, 0, "back, and nothing left");
    let renewal: i64 = db
        .query_one(
            "SELECT renewal_seq FROM shardq_limit_lease_moves WHERE holder = 'short'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        renewal > before,
        "a holder back after its lease lapsed numbers past its old rows"
    );
}

/// The race migration 48 closes: a renewal of the lease function before
/// 48 (its text as it ran, statement by statement) waits for a limits
/// row's lock while 48 moves the leases and commits; it then resumes with
/// its old text, finds the old table emptied and would grant the whole
/// limit where no one counts it. 48's transaction makes the triggers of
/// `shardq_refuse_old_limits_write.sql` (with the functions) before it
/// commits, so the resumed call's write fails (40001) and grants nothing.
/// A test shard has no old table (49 dropped it): it is made again here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_renewal_that_waited_for_migration_48_fails_instead_of_granting() {
    let shards = common::TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let db = set.get(0).client().await.unwrap();
    db.batch_execute(
        "INSERT INTO shardq_queue_limits (queue, concurrency, revision) VALUES ('capped', 5, 1); \
         CREATE TABLE shardq_limit_leases (queue text NOT NULL, holder text NOT NULL, \
             permits integer NOT NULL, expires_at timestamptz NOT NULL, \
             PRIMARY KEY (queue, holder))",
    )
    .await
    .unwrap();
    let mut migration = set.get(0).client().await.unwrap();
    let tx = migration.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE shardq_queue_limits IN EXCLUSIVE MODE")
        .await
        .unwrap();

    let mut old = set.get(0).client().await.unwrap();
    let renewal = tokio::spawn(async move {
        let tx = old.transaction().await?;
        tx.batch_execute("SELECT * FROM shardq_queue_limits WHERE queue = 'capped' FOR UPDATE")
            .await?;
        tx.batch_execute(
            "DELETE FROM shardq_limit_leases WHERE queue = 'capped' AND expires_at <= now()",
        )
        .await?;
        tx.batch_execute(
            "INSERT INTO shardq_limit_leases AS e (queue, holder, permits, expires_at) \
             VALUES ('capped', 'old-process', 5, now() + interval '5 seconds') \
             ON CONFLICT ON CONSTRAINT shardq_limit_leases_pkey \
             DO UPDATE SET permits = EXCLUDED.permits, expires_at = EXCLUDED.expires_at",
        )
        .await?;
        tx.commit().await
    });
    common::until_lock_wait(set.get(0), "the old renewal waits for the limits row").await;
    tx.batch_execute(include_str!(
        "../../migrations/functions/shardq_refuse_old_limits_write.sql"
    ))
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let refused = renewal
        .await
        .unwrap()
        .expect_err("the resumed old renewal's write");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE),
        "{refused}"
    );
    let written: i64 = db
        .query_one("SELECT count(*) FROM shardq_limit_leases", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(written, 0, "no permit granted where no one counts it");
}
