//! Key floors (migration 44, migrations/functions/shardq_promote_keys.sql):
//! a keyed claim's and a completion's reads of one key start at the key's
//! floor, so a held horizon no longer makes them walk every job the key
//! ran; and no unfinished job of a key is ever left below its floor, by a
//! retry, a writer racing the floor's move, or an enqueue that commits
//! after the floor moved past its number.

use super::ready_floors::{claim, let_floors_move, shard};
use crate::common;
use shardq::client::Client;
use shardq::job::JobId;
use tokio_postgres::GenericClient;

/// Inserts one ready job of key `key` in queue `q`; returns its id.
async fn enqueue(db: &impl GenericClient, key: &str) -> i64 {
    db.query_one(
        "INSERT INTO workflow_status (shard_key, queue, handler, ordering_key) \
         VALUES (7, 'q', 'noop', $1) RETURNING id",
        &[&key],
    )
    .await
    .unwrap()
    .get(0)
}

/// Finishes job `id` as `status` and releases its key, as a completion does
/// (the key lock taken, the promotion after), the floor moved on every
/// call (`shardq.key_floor_every` = 1).
async fn finish(db: &impl GenericClient, id: i64, status: &str) {
    db.execute(
        "SELECT set_config('shardq.key_floor_every', '1', false)",
        &[],
    )
    .await
    .unwrap();
    db.batch_execute(&format!(
        "BEGIN;
         SELECT shardq_lock_keys(ARRAY[7], ARRAY[{id}::bigint]);
         UPDATE workflow_status SET status = '{status}', finished_at = now() WHERE id = {id};
         SELECT shardq_promote_keys(ARRAY[7], ARRAY[{id}::bigint]);
         COMMIT;"
    ))
    .await
    .unwrap();
}

async fn key_floor(db: &impl GenericClient, key: &str) -> Option<i64> {
    db.query_opt(
        "SELECT floor_id FROM shardq_key_floors WHERE queue = 'q' AND ordering_key = $1",
        &[&key],
    )
    .await
    .unwrap()
    .map(|r| r.get(0))
}

/// Runs `jobs` jobs of key `busy` one after another (each claimed and
/// finished), lets the floors move, then enqueues its next job: its id.
async fn run_then_enqueue(db: &tokio_postgres::Client, jobs: usize) -> i64 {
    for _ in 0..jobs {
        let id = enqueue(db, "busy").await;
        assert_eq!(claim(db, "q", 1).await, vec![id]);
        finish(db, id, "succeeded").await;
    }
    let_floors_move(db).await;
    enqueue(db, "busy").await
}

/// Entries of the per-key index walked (index entries returned).
const KEY_INDEX_ENTRIES: &str =
    "SELECT pg_stat_get_xact_tuples_returned('workflow_status_key'::regclass)::bigint";

/// Floor rows read, scanned or fetched by an index.
const FLOOR_ROWS: &str = "SELECT (pg_stat_get_xact_tuples_returned('shardq_key_floors'::regclass) \
    + pg_stat_get_xact_tuples_fetched('shardq_key_floors'::regclass))::bigint";

/// What `counter` (one of the statistics above) grew by over one claim and
/// one completion of the key's next job `id`, in one transaction (rolled
/// back).
async fn read_by_next_job(db: &mut tokio_postgres::Client, id: i64, counter: &str) -> i64 {
    let tx = db.transaction().await.unwrap();
    let before: i64 = tx.query_one(counter, &[]).await.unwrap().get(0);
    let taken: Vec<i64> = tx
        .query(super::ready_floors::CLAIM, &[&"q", &1i32])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(taken, vec![id], "the key's next job");
    tx.batch_execute(&format!(
        "UPDATE workflow_status SET status = 'succeeded' WHERE id = {id};
         SELECT shardq_promote_keys(ARRAY[7], ARRAY[{id}::bigint]);"
    ))
    .await
    .unwrap();
    let after: i64 = tx.query_one(counter, &[]).await.unwrap().get(0);
    tx.rollback().await.unwrap();
    after - before
}

/// The collapse, per key: a REPEATABLE READ snapshot held open keeps the
/// versions of 300 jobs one key ran one after another. The claim and the
/// completion of its next job read a few entries of the per-key index;
/// with the floor deleted (floor 0: reads from the key's first job, as
/// before migration 44) they walk them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_held_snapshot_a_keys_reads_start_at_its_floor() {
    let (shards, set) = shard().await;
    let mut db = set.get(0).client().await.unwrap();
    let holder = common::hold_snapshot(&shards.urls[0]).await;

    let next = run_then_enqueue(&db, 300).await;
    let read = read_by_next_job(&mut db, next, KEY_INDEX_ENTRIES).await;
    assert!(
        read <= 40,
        "a claim and a completion of the key's next job read {read} entries of its index"
    );
    db.execute("DELETE FROM shardq_key_floors", &[])
        .await
        .unwrap();
    let read = read_by_next_job(&mut db, next, KEY_INDEX_ENTRIES).await;
    assert!(
        read >= 300,
        "the snapshot held the key's 300 jobs: reads from its first job read {read} entries"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// A claim and a completion probe their key's floor, not every floor of
/// the queue: with 2,000 other keys' floors (each with versions held by a
/// snapshot), the session that ran the key's jobs reads a few floor rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_floor_is_probed_by_its_key() {
    let (shards, set) = shard().await;
    let mut db = set.get(0).client().await.unwrap();
    db.batch_execute(
        "INSERT INTO shardq_key_floors (queue, ordering_key, floor_id) \
         SELECT 'q', 'other-' || g, 1 FROM generate_series(1, 2000) g",
    )
    .await
    .unwrap();
    let holder = common::hold_snapshot(&shards.urls[0]).await;
    db.batch_execute("UPDATE shardq_key_floors SET floor_id = 2")
        .await
        .unwrap();
    let next = run_then_enqueue(&db, 20).await;
    let read = read_by_next_job(&mut db, next, FLOOR_ROWS).await;
    assert!(
        read <= 20,
        "a claim and a completion of one key read {read} floor rows"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// A dead job retried after its key's floor moved past it (the key ran
/// later jobs meanwhile) comes back `waiting` below the floor: the trigger
/// lowers the floor, so the promotion sees it and it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_retried_below_its_keys_floor_runs() {
    let (shards, set) = shard().await;
    let config = shards.config("");
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let db = set.get(0).client().await.unwrap();

    let first = enqueue(&***db, "k").await;
    assert_eq!(claim(&db, "q", 1).await, vec![first]);
    finish(&***db, first, "dead").await;
    for _ in 0..3 {
        let id = enqueue(&***db, "k").await;
        assert_eq!(claim(&db, "q", 1).await, vec![id]);
        finish(&***db, id, "succeeded").await;
    }
    let floor = key_floor(&***db, "k").await.expect("the floor moved");
    assert!(
        floor > first,
        "the floor {floor} passed the dead job {first}"
    );

    let retried = JobId {
        shard_key: 7,
        id: first,
    };
    assert!(client.retry(retried).await.unwrap());
    let_floors_move(&db).await;
    assert_eq!(
        claim(&db, "q", 1).await,
        vec![first],
        "the retried job runs"
    );
}

/// The race of the floor's move: a writer without the key lock brings a
/// job back below the floor and has not committed when a completion of the
/// key moves the floor up, from a snapshot without that job. (shardq's own
/// such writers, a retry and a range's release, hold the key lock or hold
/// all the key's jobs; a hand-written update need not.) The move compares
/// the floor row's version, finds the one the trigger made, and leaves
/// it: the job stays above the floor and is queued by the next promotion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_move_racing_a_job_brought_back_below_it_leaves_the_floor() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    let mut writer = set.get(0).client().await.unwrap();
    let mut mover = set.get(0).client().await.unwrap();

    let back = enqueue(&***db, "k").await;
    assert_eq!(claim(&db, "q", 1).await, vec![back]);
    finish(&***db, back, "dead").await;
    let running = enqueue(&***db, "k").await;
    assert_eq!(claim(&db, "q", 1).await, vec![running]);
    let floor = key_floor(&***db, "k").await.expect("a floor row");
    assert!(floor > back);

    let w = writer.transaction().await.unwrap();
    w.execute(
        "UPDATE workflow_status SET status = 'waiting', finished_at = NULL WHERE id = $1",
        &[&back],
    )
    .await
    .unwrap();

    let m = mover.transaction().await.unwrap();
    m.execute(
        "SELECT set_config('shardq.key_floor_every', '1', true)",
        &[],
    )
    .await
    .unwrap();
    m.execute(
        "UPDATE workflow_status SET status = 'succeeded', finished_at = now() WHERE id = $1",
        &[&running],
    )
    .await
    .unwrap();
    let promote_sql = format!("SELECT shardq_promote_keys(ARRAY[7], ARRAY[{running}::bigint])");
    let promote = m.batch_execute(&promote_sql);
    let commit_writer = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        w.commit().await.unwrap();
    };
    let (promoted, ()) = tokio::join!(promote, commit_writer);
    promoted.unwrap();
    m.commit().await.unwrap();

    let floor = key_floor(&***db, "k").await.expect("a floor row");
    assert!(
        floor <= back,
        "the floor moved to {floor}, past job {back} brought back meanwhile"
    );
    finish(&***db, running, "succeeded").await;
    let_floors_move(&db).await;
    assert_eq!(
        claim(&db, "q", 1).await,
        vec![back],
        "the job brought back runs"
    );
}

/// An enqueue that commits after its key's floor moved past its number:
/// the key's next job ran and finished meanwhile, and another runs now. A
/// claim meets the late job as its key's head, reads the key from it (the
/// key is busy), parks it and lowers the floor: when the running job
/// finishes, the promotion queues it and it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_committed_after_the_floor_passed_its_number_runs() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    let mut late = set.get(0).client().await.unwrap();
    // The queue's ready floors, written by its first job, exist before
    // the late transaction's job waits on them.
    let first = enqueue(&***db, "first").await;
    assert_eq!(claim(&db, "q", 1).await, vec![first]);

    let tx = late.transaction().await.unwrap();
    let held_back = enqueue(&*tx, "k").await;
    let ran = enqueue(&***db, "k").await;
    assert_eq!(claim(&db, "q", 1).await, vec![ran]);
    finish(&***db, ran, "succeeded").await;
    let runs = enqueue(&***db, "k").await;
    assert_eq!(claim(&db, "q", 1).await, vec![runs]);
    let floor = key_floor(&***db, "k").await.expect("a floor row");
    assert!(
        floor > held_back,
        "the floor {floor} passed job {held_back}"
    );

    tx.commit().await.unwrap();
    let_floors_move(&db).await;
    assert_eq!(
        claim(&db, "q", 10).await,
        Vec::<i64>::new(),
        "the key is busy: the late job waits"
    );
    let floor = key_floor(&***db, "k").await.expect("a floor row");
    assert!(floor <= held_back, "the claim lowered the floor to {floor}");
    finish(&***db, runs, "succeeded").await;
    let_floors_move(&db).await;
    assert_eq!(claim(&db, "q", 10).await, vec![held_back]);
}

/// Maintenance deletes the floors of keys quiet for an hour, and only
/// those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floors_of_quiet_keys_are_forgotten() {
    let (_shards, set) = shard().await;
    let db = set.get(0).client().await.unwrap();
    db.batch_execute(
        "INSERT INTO shardq_key_floors (queue, ordering_key, floor_id, set_at) VALUES \
         ('q', 'quiet', 10, now() - interval '61 minutes'), ('q', 'recent', 10, now())",
    )
    .await
    .unwrap();
    let forgotten = shardq::store::upkeep::forget_quiet_key_floors(set.get(0), 100, 100.0)
        .await
        .unwrap();
    assert_eq!(forgotten, 1);
    assert_eq!(key_floor(&***db, "quiet").await, None);
    assert_eq!(key_floor(&***db, "recent").await, Some(10));
}
