//! Grouped claims by turn (migrations 41-42; migrations/functions/
//! shardq_take_turn.sql, shardq_move_group_rounds.sql and
//! shardq_claim_grouped.sql): a grouped job gets a turn when it becomes
//! ready, claims of a queue without group limits take jobs in turn order
//! from the queue's grouped floor, a group with nothing ready joins the
//! current round, and the floor never passes a job that is, or may still
//! become, ready.

use super::ready_floors::{claim, shard, MOVE_GAP};
use crate::common;
use common::TestShards;
use shardq::shards::{PooledClient, ShardSet};
use tokio_postgres::GenericClient;

/// Inserts `n` ready jobs of `group` in `queue`; returns their ids.
async fn enqueue_group(db: &impl GenericClient, queue: &str, group: &str, n: i64) -> Vec<i64> {
    db.query(
        "INSERT INTO workflow_status (shard_key, queue, handler, job_group) \
         SELECT 7, $1, 'noop', $2 FROM generate_series(1, $3::bigint) g RETURNING id",
        &[&queue, &group, &n],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Moves of the ready floors, spaced past the move interval: each may move
/// every queue's grouped rounds (a floor's move waits for the barrier the
/// move before it left).
async fn let_rounds_move(db: &tokio_postgres::Client) {
    for _ in 0..3 {
        tokio::time::sleep(MOVE_GAP).await;
        db.query_one("SELECT shardq_advance_ready_floors()", &[])
            .await
            .unwrap();
    }
}

/// How many of `ids` are jobs of `group`.
async fn of_group(db: &tokio_postgres::Client, ids: &[i64], group: &str) -> i64 {
    db.query_one(
        "SELECT count(*) FROM workflow_status WHERE id = ANY($1) AND job_group = $2",
        &[&ids, &group],
    )
    .await
    .unwrap()
    .get(0)
}

/// A session of its own on `url`: a producer whose transaction the test
/// holds open.
async fn producer(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// A shard with `n` jobs of group `a` in queue `q`, one claimed (the
/// queue's rounds begin), and the rounds moved since.
async fn begun(n: i64) -> (TestShards, ShardSet, PooledClient) {
    let (shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    enqueue_group(&***db, "q", "a", n).await;
    assert_eq!(
        claim(&db, "q", 1).await.len(),
        1,
        "the queue's rounds begin"
    );
    let_rounds_move(&db).await;
    (shards, set, db)
}

async fn floor_turn(db: &tokio_postgres::Client, queue: &str) -> i64 {
    db.query_one(
        "SELECT floor_turn FROM shardq_group_rounds WHERE queue = $1",
        &[&queue],
    )
    .await
    .unwrap()
    .get(0)
}

/// Two groups of 500 queued first, 50 turns of each claimed; a third group
/// that queues 10 then starts at the next round: the next claim of 14
/// takes the two jobs of the round being claimed, then 4 of each group.
/// Numbered from the start of its line instead, it would have jumped ahead
/// (10 of the 14); behind the others' backlogs, it would have waited for
/// 900 jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_with_nothing_ready_joins_the_round_being_claimed() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    enqueue_group(&***db, "q", "a", 500).await;
    enqueue_group(&***db, "q", "b", 500).await;
    let first = claim(&db, "q", 100).await;
    assert_eq!(
        (
            of_group(&db, &first, "a").await,
            of_group(&db, &first, "b").await
        ),
        (50, 50),
        "turn by turn"
    );
    let_rounds_move(&db).await;

    let late = enqueue_group(&***db, "q", "c", 10).await;
    let turns: Vec<i64> = db
        .query(
            "SELECT turn FROM workflow_status WHERE id = ANY($1) ORDER BY id",
            &[&late],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(turns, (51..61).collect::<Vec<i64>>(), "from the next round");
    let next = claim(&db, "q", 14).await;
    assert_eq!(next.len(), 14);
    assert_eq!(of_group(&db, &next, "c").await, 4, "one group of three");
}

/// The collapse, for grouped jobs: a REPEATABLE READ snapshot held open
/// keeps the ready versions of 3,000 claimed grouped jobs (30 groups of
/// 100). A claim of 100 new ones still reads about its batch of index
/// entries, where a walk from the start of the grouped ready index reads
/// all 3,000 dead ones (as every claim of a group's head did before
/// migration 41).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_held_snapshot_a_grouped_claim_reads_only_what_was_claimed_since_the_floor_moved() {
    let (_shards, _set, mut db, holder) = claimed_behind_a_held_snapshot().await;

    let (read, claimed) = entries_read(&mut db, super::ready_floors::CLAIM).await;
    assert_eq!(claimed, 100);
    assert!(
        read <= 500,
        "a grouped claim of 100 read {read} index entries"
    );

    let from_start = "SELECT id FROM workflow_status WHERE queue = $1 AND status = 'queued' \
        AND job_group IS NOT NULL ORDER BY turn, priority, id LIMIT $2::int";
    let (read, found) = entries_read(&mut db, from_start).await;
    assert_eq!(found, 100);
    assert!(
        read >= 3_000,
        "the snapshot held the claimed jobs' versions: a walk from the start read {read}"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// The same snapshot, with the floor left behind everything claimed (as
/// between two moves of the rounds, or while a producer that wrote stays
/// open): the claim's choice of path walks the 3,000 dead entries once to
/// find the first ready turn, and the claim's walk starts at that turn
/// instead of walking them a second time from the floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grouped_claim_walks_what_lies_behind_its_floor_once() {
    let (_shards, _set, mut db, holder) = claimed_behind_a_held_snapshot().await;
    // The floor back at the start, and no move for an hour.
    db.batch_execute(
        "UPDATE shardq_group_round_moves SET floor_turn = 0 WHERE queue = 'q'; \
         UPDATE shardq_ready_barrier SET advanced_at = now() + interval '1 hour'",
    )
    .await
    .unwrap();

    let (read, claimed) = entries_read(&mut db, super::ready_floors::CLAIM).await;
    assert_eq!(claimed, 100);
    assert!(
        (3_000..4_500).contains(&read),
        "a grouped claim of 100 behind 3,000 dead entries read {read} index entries"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// A REPEATABLE READ snapshot held open (the holder, returned) keeping the
/// ready versions of 3,000 claimed grouped jobs of queue `q` (30 groups of
/// 100), the rounds moved past them, and 100 new jobs of 100 groups.
async fn claimed_behind_a_held_snapshot(
) -> (TestShards, ShardSet, PooledClient, tokio_postgres::Client) {
    let (shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    for g in 0..30 {
        enqueue_group(&***db, "q", &format!("old-{g}"), 100).await;
    }
    for _ in 0..30 {
        assert_eq!(claim(&db, "q", 100).await.len(), 100);
    }
    let_rounds_move(&db).await;
    for g in 0..100 {
        enqueue_group(&***db, "q", &format!("new-{g}"), 1).await;
    }
    (shards, set, db, holder)
}

/// Index entries of every index of `workflow_status` read by `sql` (one
/// claim of 100 of queue `q`) in one transaction, and the rows it returned.
async fn entries_read(db: &mut tokio_postgres::Client, sql: &str) -> (i64, usize) {
    const RETURNED: &str = "SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid))::bigint \
        FROM pg_index WHERE indrelid = 'workflow_status'::regclass";
    let tx = db.transaction().await.unwrap();
    let before: i64 = tx.query_one(RETURNED, &[]).await.unwrap().get(0);
    let rows = tx.query(sql, &[&"q", &100i32]).await.unwrap().len();
    let after: i64 = tx.query_one(RETURNED, &[]).await.unwrap().get(0);
    tx.rollback().await.unwrap();
    (after - before, rows)
}

/// The race the barrier is for: a producer numbers a job from the round it
/// read, and stays open while claims take everything else and the rounds
/// move on (with nothing visible ready, the round jumps past every turn
/// given). The floor does not pass the open producer's turn; once it
/// commits, its job is claimed. A floor moved without the barrier would
/// have left it behind, never claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grouped_job_numbered_before_the_rounds_moved_and_committed_after_is_claimed() {
    let (shards, _set, db) = begun(10).await;
    let mut producer = producer(&shards.urls[0]).await;
    let open = producer.transaction().await.unwrap();
    let late = enqueue_group(&open, "q", "late", 1).await[0];
    let late_turn: i64 = open
        .query_one("SELECT turn FROM workflow_status WHERE id = $1", &[&late])
        .await
        .unwrap()
        .get(0);

    assert_eq!(claim(&db, "q", 100).await.len(), 9);
    let_rounds_move(&db).await;
    let_rounds_move(&db).await;
    let round: i64 = db
        .query_one(
            "SELECT round FROM shardq_group_rounds WHERE queue = 'q'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(round > 9, "the round moved past every turn given: {round}");
    let floor = floor_turn(&db, "q").await;
    assert!(
        floor <= late_turn,
        "the floor ({floor}) waits for the open producer's turn ({late_turn})"
    );

    open.commit().await.unwrap();
    assert_eq!(claim(&db, "q", 100).await, vec![late]);
    let_rounds_move(&db).await;
    assert!(floor_turn(&db, "q").await > 9, "and moves on once it ended");
}

/// A REPEATABLE READ producer would read the round with its snapshot,
/// taken before its transaction id, so before moves the barrier does not
/// wait for: here the rounds move past every turn given (nothing visible
/// ready) after its snapshot. Its job is left without a turn, numbered by
/// the next move, and claimed; numbered from the round its snapshot shows,
/// it would be below the floor, never claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeatable_read_producers_grouped_job_is_numbered_by_the_next_move() {
    let (shards, _set, db) = begun(20).await;
    let producer = producer(&shards.urls[0]).await;
    producer
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT * FROM shardq_group_rounds")
        .await
        .unwrap();
    assert_eq!(claim(&db, "q", 100).await.len(), 19);
    let_rounds_move(&db).await;
    let floor = floor_turn(&db, "q").await;
    assert!(
        floor > 21,
        "the floor moved past the snapshot's round: {floor}"
    );

    let late = enqueue_group_result(&producer, "late").await.unwrap();
    producer.batch_execute("COMMIT").await.unwrap();
    let turn: Option<i64> = db
        .query_one("SELECT turn FROM workflow_status WHERE id = $1", &[&late])
        .await
        .unwrap()
        .get(0);
    assert_eq!(turn, None, "left to the next move");
    let_rounds_move(&db).await;
    assert_eq!(claim(&db, "q", 100).await, vec![late]);
}

async fn enqueue_group_result(
    db: &tokio_postgres::Client,
    group: &str,
) -> Result<i64, tokio_postgres::Error> {
    db.query_one(
        "INSERT INTO workflow_status (shard_key, queue, handler, job_group) \
         VALUES (7, 'q', 'noop', $1) RETURNING id",
        &[&group],
    )
    .await
    .map(|r| r.get(0))
}

/// Jobs without a group are one group more, also in claims of one job
/// (a worker whose limit leaves it one permit claims one): with one group
/// and ungrouped jobs ready, claims of 1 take both kinds, about half each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_one_job_take_grouped_and_ungrouped_jobs_in_turn() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    enqueue_group(&***db, "q", "g", 60).await;
    db.batch_execute(
        "INSERT INTO workflow_status (shard_key, queue, handler) \
         SELECT 7, 'q', 'noop' FROM generate_series(1, 60)",
    )
    .await
    .unwrap();
    let mut taken = Vec::new();
    for _ in 0..40 {
        taken.extend(claim(&db, "q", 1).await);
    }
    assert_eq!(taken.len(), 40);
    let grouped = of_group(&db, &taken, "g").await;
    assert!(
        (8..=32).contains(&grouped),
        "{grouped} of 40 claims of one took the group's jobs"
    );
}

/// Claims of a queue whose grouped jobs are always ready, spaced so that
/// each finds both moves due, move the queue's plain ready floors (they
/// take its ungrouped jobs too) and its grouped rounds: the ready floors
/// are moved before the claim locks a job, and the rounds' move needs no
/// transaction without an id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_claims_move_the_plain_ready_floors() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    for g in 0..20 {
        enqueue_group(&***db, "q", &format!("g{g}"), 50).await;
    }
    db.batch_execute(
        "INSERT INTO workflow_status (shard_key, queue, handler) \
         SELECT 7, 'q', 'noop' FROM generate_series(1, 200)",
    )
    .await
    .unwrap();
    let floor = || async {
        let f: i64 = db
            .query_one(
                "SELECT floor_seq FROM shardq_ready_floors WHERE queue = 'q' AND priority = 0",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        f
    };
    let before = floor().await;
    for _ in 0..5 {
        tokio::time::sleep(MOVE_GAP).await;
        assert_eq!(claim(&db, "q", 42).await.len(), 42);
    }
    assert!(
        floor().await > before,
        "the plain floor moved past {before}"
    );
    assert!(
        floor_turn(&db, "q").await > 0,
        "and the grouped floor, in the same claims"
    );
}

/// A transaction reads its queue's round once (its first grouped job) and
/// numbers every later grouped job of the queue from that read, even after
/// the rounds moved on: the floor waits for it, and both of its jobs are
/// claimed once it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_numbers_from_the_round_it_read_first_is_claimed_whole() {
    let (shards, _set, db) = begun(20).await;
    let mut producer = producer(&shards.urls[0]).await;
    let open = producer.transaction().await.unwrap();
    let first = enqueue_group(&open, "q", "x", 1).await[0];
    assert_eq!(claim(&db, "q", 100).await.len(), 19);
    let_rounds_move(&db).await;
    let_rounds_move(&db).await;
    let second = enqueue_group(&open, "q", "y", 1).await[0];
    open.commit().await.unwrap();

    let mut both = claim(&db, "q", 100).await;
    both.sort();
    assert_eq!(both, vec![first, second]);
}

/// Under group limits a group's jobs are taken in the order they became
/// ready, as without limits: the group's oldest job, made ready again (a
/// retry, a release), is taken after the two queued before that, both in a
/// claim of the group's head alone and in a claim of its run (two jobs).
/// Taken by id, as before migration 46, it would have come first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_group_limits_a_group_runs_its_jobs_in_the_order_they_became_ready() {
    for claimed in [1, 2] {
        let (_shards, _set, db) = a_shard_with_group_limits().await;
        let ids = enqueue_group(&***db, "q", "a", 3).await;
        db.execute(
            "UPDATE workflow_status SET status = 'scheduled', run_at = now() WHERE id = $1",
            &[&ids[0]],
        )
        .await
        .unwrap();
        db.execute(
            "UPDATE workflow_status SET status = 'queued' WHERE id = $1",
            &[&ids[0]],
        )
        .await
        .unwrap();
        // Returned by id: the first `claimed` in ready order, sorted.
        let taken = claim(&db, "q", claimed).await;
        let mut first = [ids[1], ids[2], ids[0]][..claimed as usize].to_vec();
        first.sort();
        assert_eq!(taken, first, "a claim of {claimed}");
    }
}

/// A grouped job without a turn (a REPEATABLE READ producer's) in a queue
/// with group limits is numbered by the moves of the rounds like any other:
/// the limited claim makes the queue's rounds row, which the moves number
/// from. Without it the job kept no turn, and a group's jobs taken in
/// ready order would leave it behind every numbered job for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_group_limits_a_job_without_a_turn_is_numbered() {
    let (shards, _set, db) = a_shard_with_group_limits().await;
    enqueue_group(&***db, "q", "a", 2).await;
    let producer = producer(&shards.urls[0]).await;
    producer
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    let late = enqueue_group_result(&producer, "a").await.unwrap();
    producer.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        turn_of(&db, late).await,
        None,
        "a REPEATABLE READ producer's job"
    );

    assert_eq!(claim(&db, "q", 1).await.len(), 1);
    let_rounds_move(&db).await;
    assert!(
        turn_of(&db, late).await.is_some(),
        "numbered by a move of the rounds"
    );
    let mut rest = Vec::new();
    for _ in 0..3 {
        rest.extend(claim(&db, "q", 1).await);
    }
    assert!(rest.contains(&late), "claimed: {rest:?}");
}

/// A bulk enqueue's rows of several queues read each queue's round once;
/// the one read is kept per transaction with its queue's name. A queue
/// named like another's name, a separator and a number took that number
/// for the other's round (its first job was numbered 6, not 0), and a round
/// below the other queue's floor would have left its job unclaimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_is_read_from_its_own_queues_round_whatever_the_names() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    let turns: Vec<(String, i64)> = db
        .query(
            "INSERT INTO workflow_status (shard_key, queue, handler, job_group) \
             VALUES (7, 'x' || chr(31) || '5', 'noop', 'a'), (7, 'x', 'noop', 'a') \
             RETURNING queue, turn",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(turns[1], ("x".to_string(), 0), "{turns:?}");
}

async fn turn_of(db: &tokio_postgres::Client, id: i64) -> Option<i64> {
    db.query_one("SELECT turn FROM workflow_status WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

/// A shard whose queue `q` runs at most 10 jobs of each group at once.
async fn a_shard_with_group_limits() -> (TestShards, ShardSet, PooledClient) {
    let (shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    db.batch_execute(
        "INSERT INTO shardq_queue_limits (queue, group_concurrency, revision) \
         VALUES ('q', 10, 1)",
    )
    .await
    .unwrap();
    (shards, set, db)
}

/// A grouped queue's rounds are rows only added and deleted (migration
/// 0047), as the ready floors are: with nothing ready, a queue's round
/// follows each move's number, yet it keeps one row, and while a snapshot
/// holds the horizon a read of its rounds meets the newest row first
/// instead of every one the moves replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_rounds_keep_one_row_and_a_held_snapshot_does_not_lengthen_their_read() {
    let (shards, _set, mut db) = begun(1).await;
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    let round = "SELECT round FROM shardq_group_rounds WHERE queue = 'q'";
    let start: i64 = db.query_one(round, &[]).await.unwrap().get(0);
    for _ in 0..200 {
        super::ready_floors::move_now(&db).await;
    }
    let risen: i64 = db.query_one(round, &[]).await.unwrap().get(0);
    assert!(risen > start, "the idle queue's round followed the moves");
    let rows: i64 = db
        .query_one(
            "SELECT count(*) FROM shardq_group_round_moves WHERE queue = 'q'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "each move replaced the row");
    db.execute("ANALYZE shardq_group_round_moves", &[])
        .await
        .unwrap();

    let (got, entries) =
        super::ready_floors::read_counting(&mut db, "shardq_group_round_moves_pkey", round).await;
    assert_eq!(got, risen);
    assert!(
        entries <= 2,
        "a read of the rounds met {entries} of the 200 replaced rows' entries"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// A job's turn is read from the end of its group's line even when the
/// table's statistics say it is empty (a new shard after autovacuum's
/// analyze, or one emptied): planned then, the read was a scan of the
/// whole table for each job, and a bulk enqueue of 16,000 grouped jobs
/// took 41-47 s. A fresh session (no plan cached) enqueues 2,000 jobs of
/// 100 groups in one statement: no sequential scan of the jobs, and each
/// group's 20 jobs get turns 0 to 19.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_is_read_from_its_groups_line_when_the_statistics_say_the_table_is_empty() {
    let (shards, _set) = shard().await;
    let db = common::connect(&shards.urls[0]).await;
    db.batch_execute("VACUUM ANALYZE workflow_status")
        .await
        .unwrap();
    let seq_scans = "SELECT pg_stat_get_xact_numscans('workflow_status'::regclass)";
    db.batch_execute("BEGIN").await.unwrap();
    let before: i64 = db.query_one(seq_scans, &[]).await.unwrap().get(0);
    db.execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, job_group) \
         SELECT 7, 'bulk', 'noop', 'g' || (g % 100) FROM generate_series(1, 2000) g",
        &[],
    )
    .await
    .unwrap();
    let after: i64 = db.query_one(seq_scans, &[]).await.unwrap().get(0);
    db.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        after - before,
        0,
        "sequential scans of the jobs in the enqueue"
    );
    let lines: Vec<(i64, i64, i64)> = db
        .query(
            "SELECT count(DISTINCT turn), min(turn), max(turn) FROM workflow_status \
             WHERE queue = 'bulk' GROUP BY job_group",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(lines.len(), 100);
    assert!(lines.iter().all(|line| *line == (20, 0, 19)), "{lines:?}");
}
