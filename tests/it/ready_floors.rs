//! Claims start at each queue's ready floor (migrations 27-29,
//! migrations/functions/shardq_lock_plain_ready.sql): while a long
//! transaction holds the xmin horizon, a claim reads only what was claimed
//! since the floor last moved, not every dead version behind it; and the
//! floor never passes a job that is, or may still become, ready.

use crate::common;

use common::TestShards;
use shardq::shards::ShardSet;
use std::time::Duration;
use tokio_postgres::GenericClient;

/// Longer than the floors' move interval (250 ms,
/// shardq_advance_ready_floors).
pub(crate) const MOVE_GAP: Duration = Duration::from_millis(300);

pub(crate) const CLAIM: &str =
    "SELECT id FROM shardq_claim(1, 0, $1, $2, 'w', 60000) WHERE id IS NOT NULL";

pub(crate) async fn shard() -> (TestShards, ShardSet) {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    (shards, set)
}

/// Inserts `n` plain ready jobs of `queue` at `priority`; returns their ids.
async fn enqueue(db: &impl GenericClient, queue: &str, priority: i32, n: i64) -> Vec<i64> {
    db.query(
        "INSERT INTO workflow_status (shard_key, queue, handler, priority) \
         SELECT g % 65536, $1, 'noop', $2 FROM generate_series(1, $3::bigint) g RETURNING id",
        &[&queue, &priority, &n],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

pub(crate) async fn claim(db: &tokio_postgres::Client, queue: &str, limit: i32) -> Vec<i64> {
    db.query(CLAIM, &[&queue, &limit])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Claims of another queue, spaced past the move interval: each may move
/// every floor of the shard (a move waits for the one before it).
pub(crate) async fn let_floors_move(db: &tokio_postgres::Client) {
    for _ in 0..3 {
        tokio::time::sleep(MOVE_GAP).await;
        claim(db, "elsewhere", 1).await;
    }
}

async fn floor(db: &tokio_postgres::Client, queue: &str) -> i64 {
    db.query_one(
        "SELECT floor_seq FROM shardq_ready_floors WHERE queue = $1 AND priority = 0",
        &[&queue],
    )
    .await
    .unwrap()
    .get(0)
}

/// Index entries of the ready index read by `sql` in one transaction.
async fn entries_read(db: &mut tokio_postgres::Client, sql: &str, queue: &str) -> (i64, usize) {
    let tx = db.transaction().await.unwrap();
    let before = common::xact_stat(&tx, "tuples_returned", &["workflow_status_ready_plain"]).await;
    let rows = tx.query(sql, &[&queue, &100i32]).await.unwrap().len();
    let read =
        common::xact_stat(&tx, "tuples_returned", &["workflow_status_ready_plain"]).await - before;
    tx.rollback().await.unwrap();
    (read, rows)
}

/// The collapse, counted: a REPEATABLE READ snapshot held open
/// keeps the ready versions of 3,000 claimed jobs; a claim still reads
/// about its batch of the ready index, while a walk from the start of the
/// index (what the claim did before) reads all 3,000 dead entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_held_snapshot_a_claim_reads_only_what_was_claimed_since_the_floor_moved() {
    let (shards, set) = shard().await;
    let mut db = set.get(0).client().await.unwrap();
    let holder = common::hold_snapshot(&shards.urls[0]).await;

    enqueue(&***db, "q", 0, 3_000).await;
    for _ in 0..30 {
        assert_eq!(claim(&db, "q", 100).await.len(), 100);
    }
    let_floors_move(&db).await;
    enqueue(&***db, "q", 0, 100).await;

    let (read, claimed) = entries_read(&mut db, CLAIM, "q").await;
    assert_eq!(claimed, 100);
    assert!(
        read <= 300,
        "a claim read {read} entries of the ready index for a batch of 100"
    );
    let from_start = "SELECT id FROM workflow_status WHERE queue = $1 AND status = 'queued' \
        AND ordering_key IS NULL AND job_group IS NULL ORDER BY priority, ready_seq LIMIT $2::int";
    let (read, found) = entries_read(&mut db, from_start, "q").await;
    assert_eq!(found, 100);
    assert!(
        read >= 3_000,
        "the snapshot held the claimed jobs' versions: a walk from the start read {read}"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// The race the floor's barrier closes: a transaction numbers a job, then
/// stays open while later jobs are claimed and the floors try to move past
/// it. The floor waits for it; once it commits, its job is claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_numbered_before_the_floor_moved_and_committed_after_is_claimed() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    let mut late = set.get(0).client().await.unwrap();
    enqueue(&***db, "q", 0, 5).await;
    claim(&db, "q", 5).await;
    let_floors_move(&db).await;

    let tx = late.transaction().await.unwrap();
    let held_back = enqueue(&*tx, "q", 0, 1).await[0];
    let seq: i64 = tx
        .query_one(
            "SELECT ready_seq FROM workflow_status WHERE id = $1",
            &[&held_back],
        )
        .await
        .unwrap()
        .get(0);
    let after = enqueue(&***db, "q", 0, 20).await;
    let mut taken = claim(&db, "q", 50).await;
    taken.sort();
    assert_eq!(taken, after, "the later jobs are claimed meanwhile");
    let_floors_move(&db).await;
    assert!(
        floor(&db, "q").await <= seq,
        "the floor passed a job whose transaction is still open"
    );

    tx.commit().await.unwrap();
    assert_eq!(claim(&db, "q", 50).await, vec![held_back]);
    let_floors_move(&db).await;
    assert!(
        floor(&db, "q").await > seq,
        "the floors move on once it is claimed"
    );
}

/// Jobs ready again behind the floor (a claim rolled back, a job released
/// or retried) are claimed: a rolled-back claim never hid its jobs from
/// the floor, and a job made ready again gets a new number past it. A
/// priority first seen after the floors moved is claimed first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_ready_again_behind_the_floor_and_new_priorities_are_claimed() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    let mut other = set.get(0).client().await.unwrap();
    let ids = enqueue(&***db, "q", 0, 10).await;

    // A claim that locks and updates the first five, then rolls back, while
    // the floors move.
    let tx = other.transaction().await.unwrap();
    let rolled_back: Vec<i64> = tx
        .query(CLAIM, &[&"q", &5i32])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rolled_back, ids[..5]);
    assert_eq!(claim(&db, "q", 5).await, ids[5..]);
    let_floors_move(&db).await;
    tx.rollback().await.unwrap();
    let_floors_move(&db).await;
    assert_eq!(
        claim(&db, "q", 10).await,
        ids[..5],
        "a rolled-back claim's jobs"
    );

    // Released (as a late claim is given back) after the floors moved past.
    let_floors_move(&db).await;
    db.execute(
        "UPDATE workflow_status SET status = 'queued', owner = NULL WHERE id = ANY($1)",
        &[&&ids[..2]],
    )
    .await
    .unwrap();
    assert_eq!(claim(&db, "q", 10).await, ids[..2], "released jobs");

    let_floors_move(&db).await;
    let low = enqueue(&***db, "q", 5, 2).await;
    let urgent = enqueue(&***db, "q", -5, 2).await;
    assert_eq!(
        claim(&db, "q", 2).await,
        urgent,
        "the new, more urgent priority first"
    );
    assert_eq!(claim(&db, "q", 2).await, low);
}

/// The floors' barrier and its key.
const BARRIER: [&str; 2] = ["shardq_ready_barrier", "shardq_ready_barrier_pkey"];

/// One move of the floors now, whatever the time since the last one: the
/// barrier's clock set back (as 250 ms of polling claims would).
/// Two transactions: a move made by a transaction that wrote is skipped.
pub(crate) async fn move_now(db: &tokio_postgres::Client) {
    let_move_now(db).await;
    db.execute("SELECT shardq_advance_ready_floors()", &[])
        .await
        .unwrap();
}

async fn let_move_now(db: &tokio_postgres::Client) {
    db.execute(
        "UPDATE shardq_ready_barrier SET advanced_at = '-infinity'",
        &[],
    )
    .await
    .unwrap();
}

/// The bigint `sql` reads, and how many entries of `index` that read met
/// (in one transaction: the count is this backend's, unflushed).
pub(crate) async fn read_counting(
    db: &mut tokio_postgres::Client,
    index: &str,
    sql: &str,
) -> (i64, i64) {
    let tx = db.transaction().await.unwrap();
    let before = common::xact_stat(&tx, "tuples_returned", &[index]).await;
    let value: i64 = tx.query_one(sql, &[]).await.unwrap().get(0);
    let after = common::xact_stat(&tx, "tuples_returned", &[index]).await;
    tx.rollback().await.unwrap();
    (value, after - before)
}

async fn floor_rows(db: &tokio_postgres::Client, queue: &str) -> i64 {
    db.query_one(
        "SELECT count(*) FROM shardq_ready_floor_moves WHERE queue = $1 AND priority = 0",
        &[&queue],
    )
    .await
    .unwrap()
    .get(0)
}

/// A floor's rows are only added and deleted (migration 0047): a move adds
/// the risen floor's row and deletes the one it replaces, so each floor
/// keeps one row, and while a snapshot holds the horizon a read of a floor
/// meets its newest row first instead of every version a move left (an
/// idle queue's floor rises at every move: it follows the sequence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_keeps_one_row_and_a_held_snapshot_does_not_lengthen_its_read() {
    let (shards, set) = shard().await;
    let mut db = set.get(0).client().await.unwrap();
    enqueue(&***db, "idle", 0, 1).await;
    assert_eq!(claim(&db, "idle", 1).await.len(), 1);
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    let start = floor(&db, "idle").await;
    for _ in 0..200 {
        move_now(&db).await;
    }
    let risen = floor(&db, "idle").await;
    assert!(
        risen > start,
        "the idle floor followed the moves: {start} -> {risen}"
    );
    assert_eq!(
        floor_rows(&db, "idle").await,
        1,
        "each move replaced the row"
    );
    // As autovacuum would (the plan with many more rows kept: the test
    // after the next one).
    db.execute("ANALYZE shardq_ready_floor_moves", &[])
        .await
        .unwrap();

    let (got, entries) = read_counting(
        &mut db,
        "shardq_ready_floor_moves_pkey",
        "SELECT floor_seq FROM shardq_ready_floors WHERE queue = 'idle' AND priority = 0",
    )
    .await;
    assert_eq!(got, risen);
    assert!(
        entries <= 2,
        "a read of the floor met {entries} of its 200 replaced rows' entries"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// A move whose transaction rolls back (the claim that made it failed)
/// leaves the floor and its one row as they were: the added row and the
/// deletion go together; the next move moves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_rolled_back_leaves_the_floor_as_it_was() {
    let (_shards, set) = shard().await;
    let mut db = set.get(0).client().await.unwrap();
    enqueue(&***db, "q", 0, 1).await;
    assert_eq!(claim(&db, "q", 1).await.len(), 1);
    move_now(&db).await;
    let before = floor(&db, "q").await;

    let_move_now(&db).await;
    let tx = db.transaction().await.unwrap();
    tx.execute("SELECT shardq_advance_ready_floors()", &[])
        .await
        .unwrap();
    let inside: i64 = tx
        .query_one(
            "SELECT floor_seq FROM shardq_ready_floors WHERE queue = 'q' AND priority = 0",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        inside > before,
        "the move rose the floor in its transaction"
    );
    tx.rollback().await.unwrap();

    assert_eq!(floor(&db, "q").await, before);
    assert_eq!(floor_rows(&db, "q").await, 1);
    move_now(&db).await;
    assert!(floor(&db, "q").await > before);
    assert_eq!(floor_rows(&db, "q").await, 1);
}

/// The shape an hour-long hold leaves, shortened: 100 floors and 100
/// grouped queues (`k000` to `k099`), each with the rows of 2,000 moves
/// (numbered 1 to 2,000, a row per floor and queue a move, in key order),
/// every row but the newest deleted and kept by the snapshot returned,
/// then the statistics taken: a few live rows over thousands of pages.
/// Each row's floors or rounds are `value`, an SQL expression of the
/// move's number `m`.
async fn keep_2000_moves_of_100(
    db: &tokio_postgres::Client,
    url: &str,
    value: &str,
) -> tokio_postgres::Client {
    db.batch_execute(
        "SELECT shardq_ensure_floors(array_agg('k' || lpad(i::text, 3, '0')), array_agg(0)) \
             FROM generate_series(0, 99) i; \
         INSERT INTO shardq_group_queues (queue) \
             SELECT 'k' || lpad(i::text, 3, '0') FROM generate_series(0, 99) i;",
    )
    .await
    .unwrap();
    let holder = common::hold_snapshot(url).await;
    db.batch_execute(&format!(
        "INSERT INTO shardq_ready_floor_moves \
             (queue, priority, move_seq, floor_seq, keyed_floor_seq) \
         SELECT 'k' || lpad(i::text, 3, '0'), 0, m, {value}, {value} \
         FROM generate_series(1, 2000) m, generate_series(0, 99) i ORDER BY m, i; \
         DELETE FROM shardq_ready_floor_moves WHERE move_seq < 2000; \
         INSERT INTO shardq_group_round_moves (queue, move_seq, round, floor_turn, noted_round) \
         SELECT 'k' || lpad(i::text, 3, '0'), m, {value}, {value}, {value} \
         FROM generate_series(1, 2000) m, generate_series(0, 99) i ORDER BY m, i; \
         DELETE FROM shardq_group_round_moves WHERE move_seq < 2000; \
         ANALYZE shardq_ready_floor_moves, shardq_group_round_moves;"
    ))
    .await
    .unwrap();
    holder
}

/// The reads of the floors and of the grouped rounds keep their plan
/// however many replaced rows a hold keeps. The shape of an hour-long hold,
/// shortened: 100 floors and 100 grouped queues, 2,000 moves of each (a
/// row per floor and queue a move, in key order), every row but the
/// newest deleted and kept by a held snapshot, then the statistics taken:
/// a few live rows over thousands of pages. The same read written inline
/// (as migration 47's view reads) walks the kept rows, by bitmap scan or
/// not; through the views each read meets the newest row first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floors_and_rounds_reads_keep_their_plan_with_many_rows_kept() {
    let (shards, set) = shard().await;
    let mut db = set.get(0).client().await.unwrap();
    let holder = keep_2000_moves_of_100(&db, &shards.urls[0], "m").await;
    for (index, through_view, inline) in [
        (
            "shardq_ready_floor_moves_pkey",
            "SELECT floor_seq FROM shardq_ready_floors WHERE queue = 'k050' AND priority = 0",
            "SELECT (SELECT f.floor_seq FROM shardq_ready_levels l \
                 CROSS JOIN LATERAL (SELECT m.floor_seq FROM shardq_ready_floor_moves m \
                     WHERE m.queue = l.queue AND m.priority = l.priority \
                     ORDER BY m.move_seq DESC LIMIT 1) f \
                 WHERE l.queue = 'k050' AND l.priority = 0)",
        ),
        (
            "shardq_group_round_moves_pkey",
            "SELECT floor_turn FROM shardq_group_rounds WHERE queue = 'k050'",
            "SELECT (SELECT r.floor_turn FROM shardq_group_queues q \
                 CROSS JOIN LATERAL (SELECT m.floor_turn FROM shardq_group_round_moves m \
                     WHERE m.queue = q.queue ORDER BY m.move_seq DESC LIMIT 1) r \
                 WHERE q.queue = 'k050')",
        ),
    ] {
        let (newest, entries) = read_counting(&mut db, index, through_view).await;
        assert_eq!(newest, 2000, "{through_view}");
        assert!(
            entries <= 2,
            "{through_view} met {entries} entries of {index} for the newest row"
        );
        // The control: the scenario does make the inline read walk them.
        let (newest, walked) = read_counting(&mut db, index, inline).await;
        assert_eq!(newest, 2000, "{inline}");
        assert!(walked >= 1000, "{inline} met only {walked} entries");
    }
    holder.batch_execute("COMMIT").await.unwrap();
}

/// The barrier a move leaves for the next is a row only added and deleted
/// (migration 49): a move deletes the row it read and adds its own, keyed
/// by the number it took. While a snapshot holds the horizon the replaced
/// rows stay, and a move still reads only the newest, first in a backward
/// walk of the key: the blocks of the barrier one move reads do not grow
/// with the moves held: 14 here, 8 of the table and 6 of its key, at 200,
/// 1,000 and 3,000 moves (the row updated in place, as before, made each
/// move read every version kept: 65 blocks at 1,000 moves).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_barrier_keeps_one_row_and_a_held_snapshot_does_not_lengthen_a_moves_read() {
    let (shards, set) = shard().await;
    let mut db = set.get(0).client().await.unwrap();
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    for _ in 0..1000 {
        move_now(&db).await;
    }
    let barrier = "SELECT count(*), max(pending_seq) FROM shardq_ready_barrier";
    let row = db.query_one(barrier, &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 1, "each move replaced the row");
    let last: i64 = row.get(1);
    db.batch_execute("ANALYZE shardq_ready_barrier")
        .await
        .unwrap();

    let_move_now(&db).await;
    let tx = db.transaction().await.unwrap();
    let before = common::xact_stat(&tx, "blocks_fetched", &BARRIER).await;
    tx.execute("SELECT shardq_advance_ready_floors()", &[])
        .await
        .unwrap();
    let read = common::xact_stat(&tx, "blocks_fetched", &BARRIER).await - before;
    let moved: i64 = tx.query_one(barrier, &[]).await.unwrap().get(1);
    tx.commit().await.unwrap();
    assert!(moved > last, "the move left its own row: {last} -> {moved}");
    assert!(
        read <= 20,
        "a move read {read} blocks of the barrier with 1,000 moves held"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// A move itself keeps its plan however many replaced rows a hold keeps:
/// it deletes each replaced floor's and grouped queue's row by its key,
/// never by a walk of every row kept. The shape of
/// [`the_floors_and_rounds_reads_keep_their_plan_with_many_rows_kept`]:
/// 100 floors and 100 grouped queues, 2,000 moves' rows each kept, the
/// statistics taken (a few live rows over thousands of pages: the planner
/// then joined the rows to delete to a walk of the whole key, every entry
/// kept: 13-14 ms a move of 10 floors after an hour of moves); then two moves,
/// the second counted: it moves every floor and every queue's rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_deletes_the_rows_it_replaces_by_their_key_with_many_rows_kept() {
    let (shards, set) = shard().await;
    let mut db = set.get(0).client().await.unwrap();
    let holder = keep_2000_moves_of_100(&db, &shards.urls[0], "0").await;
    db.batch_execute("SELECT setval('shardq_ready_seq', 100000)")
        .await
        .unwrap();
    move_now(&db).await;
    let_move_now(&db).await;
    let count =
        "SELECT pg_stat_get_xact_tuples_returned('shardq_ready_floor_moves_pkey'::regclass), \
                 pg_stat_get_xact_tuples_returned('shardq_group_round_moves_pkey'::regclass)";
    let tx = db.transaction().await.unwrap();
    let before = tx.query_one(count, &[]).await.unwrap();
    tx.execute("SELECT shardq_advance_ready_floors()", &[])
        .await
        .unwrap();
    let after = tx.query_one(count, &[]).await.unwrap();
    tx.commit().await.unwrap();
    let met = |i: usize| after.get::<_, i64>(i) - before.get::<_, i64>(i);
    let moved = "SELECT (SELECT count(*) FROM shardq_ready_floors WHERE floor_seq > 0), \
                 (SELECT count(*) FROM shardq_group_rounds WHERE round > 0), \
                 (SELECT count(*) FROM shardq_ready_floor_moves), \
                 (SELECT count(*) FROM shardq_group_round_moves)";
    let row = db.query_one(moved, &[]).await.unwrap();
    let counts: Vec<i64> = (0..4).map(|i| row.get(i)).collect();
    assert_eq!(
        counts,
        [100, 100, 100, 100],
        "every floor and queue moved, one row each"
    );
    assert!(
        met(0) <= 1000 && met(1) <= 1000,
        "a move of 100 floors and 100 queues met {} and {} entries of 200,000 kept",
        met(0),
        met(1)
    );
    holder.batch_execute("COMMIT").await.unwrap();
}
