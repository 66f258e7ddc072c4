//! One current schema: a fresh shard matches `migrations/schema.sql`; a shard
//! migrated to version 16 by the code before functions had their own files
//! (`fixtures/shard_at_0016.sql`) ends, migrated by this code, with exactly
//! the fresh schema; a function whose recorded text differs is applied again.

use super::snapshot::snapshot;
use super::*;
use crate::config::Config;
use crate::shards::ShardSet;
use shardq_local::{create_database, EphemeralServer};

/// The checked-in snapshot of a freshly migrated shard.
const SCHEMA_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/schema.sql");

/// Setting this writes the snapshot to [`SCHEMA_FILE`] instead of comparing.
const UPDATE_VAR: &str = "SHARDQ_UPDATE_SCHEMA";

/// The command that regenerates [`SCHEMA_FILE`].
const REGENERATE: &str =
    "SHARDQ_UPDATE_SCHEMA=1 cargo test -p shardq --lib migrate::upgrade_tests::a_fresh_shard";

/// The header of [`SCHEMA_FILE`].
fn header() -> String {
    format!(
        "-- The schema of a shard migrated by this shardq, read from the catalog\n\
         -- (src/migrate/snapshot.rs). Generated; do not edit. A test fails when a\n\
         -- migration or a function file changes it; regenerate with:\n\
         --   {REGENERATE}\n\n"
    )
}

/// Pools over database `db` of `server`, migrated.
async fn migrated(server: &EphemeralServer, db: &str) -> ShardSet {
    let shards = pools(server, db);
    migrate_all(&shards).await.expect("migrate");
    shards
}

/// Pools over database `db` of `server`.
fn pools(server: &EphemeralServer, db: &str) -> ShardSet {
    let url = server.url().replace("/shardq", &format!("/{db}"));
    let toml = format!("[[shards]]\nname = \"s0\"\nurl = \"{url}\"\npool_size = 2\n");
    ShardSet::connect(&Config::from_toml(&toml).expect("config")).expect("connect")
}

/// A plain connection to database `db` of `server`.
async fn connect(server: &EphemeralServer, db: &str) -> tokio_postgres::Client {
    let url = server.url().replace("/shardq", &format!("/{db}"));
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

/// The snapshot of database `db`, on a connection of its own.
async fn snapshot_of(server: &EphemeralServer, db: &str) -> String {
    snapshot(&connect(server, db).await)
        .await
        .expect("snapshot")
}

/// Creates database `upgraded` holding the version-16 shard of the fixture.
async fn load_fixture(server: &EphemeralServer) {
    create_database(&server.admin_url(), "upgraded")
        .await
        .expect("create database");
    // The dump empties search_path on its connection: load it on its own.
    connect(server, "upgraded")
        .await
        .batch_execute(include_str!("fixtures/shard_at_0016.sql"))
        .await
        .expect("load the version-16 shard");
}

/// The function definitions of a snapshot (everything from the first one).
fn functions_part(snapshot: &str) -> &str {
    snapshot
        .find("\n-- EXECUTE:")
        .map_or("", |at| &snapshot[at..])
}

/// Panics with the first differing line when `found` is not `expected`.
fn assert_same(expected: &str, found: &str, what: &str, fix: &str) {
    if expected == found {
        return;
    }
    let (e, f): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), found.lines().collect());
    let at = e
        .iter()
        .zip(&f)
        .position(|(a, b)| a != b)
        .unwrap_or(e.len().min(f.len()));
    let window = |lines: &[&str]| {
        lines[at.saturating_sub(3)..(at + 6).min(lines.len())]
            .iter()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    panic!(
        "{what}: first difference at line {} ({} lines expected, {} found)\n\
         expected:\n{}found:\n{}{fix}",
        at + 1,
        e.len(),
        f.len(),
        window(&e),
        window(&f)
    );
}

#[tokio::test]
async fn a_fresh_shard_matches_the_checked_in_schema() {
    let server = EphemeralServer::start().await.expect("server");
    migrated(&server, "shardq").await;
    let found = format!("{}{}", header(), snapshot_of(&server, "shardq").await);
    if std::env::var_os(UPDATE_VAR).is_some() {
        std::fs::write(SCHEMA_FILE, &found).expect("write migrations/schema.sql");
        return;
    }
    let expected = std::fs::read_to_string(SCHEMA_FILE).unwrap_or_default();
    assert_same(
        &expected,
        &found,
        "migrations/schema.sql is not the schema a fresh shard gets",
        &format!("if the change is meant, regenerate it: {REGENERATE}"),
    );
}

/// The functions are written in the transaction of the first migration
/// marked to apply them (`-- shardq:functions-with-this`), else in the run's
/// last transaction: the last migration's when it runs in one, else the
/// closing one right after it (a no-transaction migration commits
/// statement by statement). Either way no shard shows that version with its
/// functions applied before it.
#[tokio::test]
async fn on_a_fresh_shard_the_functions_commit_with_the_last_migration() {
    let server = EphemeralServer::start().await.expect("server");
    migrated(&server, "shardq").await;
    // now() is the transaction's start: equal times, one transaction. The
    // last migration run outside a transaction (its statements commit one
    // by one), the functions commit together in the run's closing
    // transaction, after it.
    let last = MIGRATIONS
        .iter()
        .find(|m| m.applies_functions())
        .or(MIGRATIONS.last())
        .expect("a migration");
    let (join, at) = match last.runs_in_transaction() {
        true => ("m.applied_at = f.applied_at", "the last migration's"),
        false => (
            "f.applied_at >= m.applied_at",
            "one after the last migration",
        ),
    };
    let db = connect(&server, "shardq").await;
    let together: i64 = db
        .query_one(
            &format!(
                "SELECT count(*) FROM shardq_functions f JOIN shardq_migrations m \
                 ON m.version = $1 AND {join}"
            ),
            &[&last.version],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(
        together,
        functions::FUNCTIONS.len() as i64,
        "{at} transaction"
    );
    let times: i64 = db
        .query_one(
            "SELECT count(DISTINCT applied_at) FROM shardq_functions",
            &[],
        )
        .await
        .expect("times")
        .get(0);
    assert_eq!(times, 1, "the functions commit in one transaction");
}

#[tokio::test]
async fn a_shard_migrated_by_the_old_code_ends_with_the_fresh_schema() {
    let server = EphemeralServer::start().await.expect("server");
    migrated(&server, "shardq").await;
    let fresh = snapshot_of(&server, "shardq").await;

    load_fixture(&server).await;
    let shards = pools(&server, "upgraded");
    // Behind the map tables of version 17 (and its functions were never
    // recorded): the start check refuses it.
    match check_all(&shards).await {
        Err(MigrateError::Behind { found: 16, .. }) => {}
        other => panic!("check of the version-16 shard: {other:?}"),
    }
    let applied = migrate_all(&shards)
        .await
        .expect("migrate the version-16 shard");
    assert_eq!(
        applied,
        vec![vec![
            17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38,
            39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52
        ]],
        "the map tables and the reshard's were due"
    );
    check_all(&shards).await.expect("check after migrate");
    assert_same(
        &fresh,
        &snapshot_of(&server, "upgraded").await,
        "the upgraded shard's schema differs from a fresh shard's",
        "",
    );
}

/// Functions added after migration 16 (new files), and those changed on
/// purpose since (the claim, for groups: migration 22; the completion, for
/// the `dead` ask of a permanent failure; the key promotion, for key
/// floors: migration 44): left out of the comparison below.
const ADDED_AFTER_16: &[&str] = &[
    "shardq_key_floor_lower",
    "shardq_key_jobs_from",
    "shardq_promote_keys",
    "shardq_shard_key",
    "shardq_route",
    "shardq_enqueue_row",
    "shardq_enqueue",
    "shardq_enqueue_many",
    "shardq_check_route",
    "shardq_hold_moving",
    "shardq_owns_key",
    "shardq_refuse_stale_snapshot",
    "shardq_lease_permits",
    "shardq_permits_in_use",
    "shardq_refuse_old_limits_write",
    "shardq_take_starts",
    "shardq_group_buckets_of",
    "shardq_group_buckets_write",
    "shardq_group_heads",
    "shardq_grouped_ready_turn",
    "shardq_queue_has_ready",
    "shardq_claim_grouped",
    "shardq_claim",
    "shardq_claim_keyed",
    "shardq_advance_ready_floors",
    "shardq_ready_floor_of",
    "shardq_group_round_of",
    "shardq_lock_plain_ready",
    "shardq_lock_keyed_ready",
    "shardq_mark_ready",
    "shardq_take_turn",
    "shardq_group_floor",
    "shardq_move_group_rounds",
    "shardq_ensure_floors",
    "shardq_owe_cascades",
    "shardq_cascades_paid",
    "shardq_take",
    "shardq_complete_many",
    "shardq_send_row",
    "shardq_send",
    "shardq_get_event",
    "shardq_start_child",
    "shardq_wake_parent",
    "shardq_child_finished",
    "shardq_wake_parents",
    "shardq_step_log",
    "shardq_step_record",
    "shardq_step_sleep",
    "shardq_hold_workflow",
    "shardq_recv_take",
    "shardq_recv",
    "shardq_child_result_decide",
    "shardq_child_result",
    "shardq_child_intent",
    "shardq_child_wait",
];

/// The functions part of a snapshot without the functions of `names`.
fn without_functions(functions: &str, names: &[&str]) -> String {
    const MARK: &str = "\n-- EXECUTE:";
    functions
        .split(MARK)
        .filter(|block| {
            !names
                .iter()
                .any(|name| block.contains(&format!("CREATE OR REPLACE FUNCTION public.{name}(")))
        })
        .collect::<Vec<_>>()
        .join(MARK)
}

/// Pins the move of the functions out of migrations 1-16 as no behaviour
/// change: each file holds exactly the text those migrations left on a
/// shard (functions added since, [`ADDED_AFTER_16`], aside). A later,
/// deliberate change to a function file fails this test: delete it then
/// (the upgrade test above still holds).
#[tokio::test]
async fn the_function_files_hold_the_texts_migrations_1_to_16_left() {
    let server = EphemeralServer::start().await.expect("server");
    migrated(&server, "shardq").await;
    let fresh = snapshot_of(&server, "shardq").await;
    load_fixture(&server).await;
    assert_same(
        &without_functions(functions_part(&fresh), ADDED_AFTER_16),
        &without_functions(
            functions_part(&snapshot_of(&server, "upgraded").await),
            ADDED_AFTER_16,
        ),
        "a function file's text differs from what migrations 1-16 left on a shard",
        "",
    );
}

#[tokio::test]
async fn a_function_whose_recorded_text_differs_is_applied_again() {
    let server = EphemeralServer::start().await.expect("server");
    let shards = migrated(&server, "shardq").await;
    let db = connect(&server, "shardq").await;
    let key_lock = "SELECT shardq_key_lock('q', 'k')";
    let expected: i64 = db.query_one(key_lock, &[]).await.expect("lock").get(0);
    // What an older binary's `migrate` would leave: another text, another hash.
    db.batch_execute(
        "CREATE OR REPLACE FUNCTION shardq_key_lock(p_queue text, p_key text) RETURNS bigint \
             LANGUAGE sql IMMUTABLE AS $$ SELECT 0::bigint $$; \
         UPDATE shardq_functions SET sha256 = 'older' WHERE name = 'shardq_key_lock'",
    )
    .await
    .expect("tamper");
    match check_all(&shards).await {
        Err(MigrateError::FunctionsDiffer { names, .. }) => {
            assert_eq!(names, vec!["shardq_key_lock".to_string()])
        }
        other => panic!("check with an older function: {other:?}"),
    }
    // No migration is due: the closing transaction applies it.
    assert_eq!(
        migrate_all(&shards).await.expect("migrate"),
        vec![Vec::<i32>::new()]
    );
    let found: i64 = db.query_one(key_lock, &[]).await.expect("lock").get(0);
    assert_eq!(
        found, expected,
        "the function's current text was applied again"
    );
    check_all(&shards).await.expect("check after migrate");
}

/// Jobs that became ready without a number (during an upgrade, before the
/// functions that number their kind were written: here, with the trigger
/// gone), a keyed one and a plain one of a queue that has no floors yet,
/// are numbered, with floors, by the transaction that writes the
/// functions: a claim takes both.
#[tokio::test]
async fn jobs_ready_without_a_number_are_numbered_when_the_functions_are_written() {
    let server = EphemeralServer::start().await.expect("server");
    let shards = migrated(&server, "shardq").await;
    let db = connect(&server, "shardq").await;
    db.batch_execute(
        "DROP TRIGGER shardq_ready_on_insert ON workflow_status; \
         INSERT INTO workflow_status (shard_key, queue, handler, ordering_key) \
             VALUES (1, 'fresh', 'noop', 'k'), (2, 'fresh', 'noop', NULL); \
         UPDATE shardq_functions SET sha256 = 'older' WHERE name = 'shardq_mark_ready'",
    )
    .await
    .expect("jobs ready unnumbered");
    migrate_all(&shards).await.expect("migrate");
    let claimed = db
        .query(
            "SELECT id FROM shardq_claim(1, 0, 'fresh', 10, 'w', 60000) WHERE id IS NOT NULL",
            &[],
        )
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2, "both jobs numbered and claimed");
    check_all(&shards).await.expect("check after migrate");
}

/// Grouped jobs ready before migration 42 (here: with its record and the
/// turn trigger gone) are numbered by it, each group's line 1, 2, 3, ...
/// by id; one that becomes ready after it, before the functions are
/// written, is left without a turn: the rounds' move after the first
/// claim of its queue numbers it, and the next claim takes it.
#[tokio::test]
async fn grouped_jobs_ready_before_their_turns_are_numbered_by_the_upgrade() {
    let server = EphemeralServer::start().await.expect("server");
    let shards = migrated(&server, "shardq").await;
    let db = connect(&server, "shardq").await;
    db.batch_execute(
        "DROP TRIGGER shardq_turn_on_insert ON workflow_status; \
         INSERT INTO workflow_status (shard_key, queue, handler, job_group) \
             VALUES (1, 'old', 'noop', 'a'), (1, 'old', 'noop', 'a'), (1, 'old', 'noop', 'a'), \
                    (2, 'old', 'noop', 'b'); \
         DELETE FROM shardq_migrations WHERE version = 42; \
         UPDATE shardq_functions SET sha256 = 'older' WHERE name = 'shardq_take_turn'",
    )
    .await
    .expect("grouped jobs ready unnumbered");
    migrate_all(&shards).await.expect("migrate");
    let turns: Vec<(String, i64)> = db
        .query(
            "SELECT job_group, turn FROM workflow_status ORDER BY job_group, id",
            &[],
        )
        .await
        .expect("turns")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let line = |g: &str, t: i64| (g.to_string(), t);
    assert_eq!(
        turns,
        vec![line("a", 1), line("a", 2), line("a", 3), line("b", 1)]
    );
    db.batch_execute(
        "DROP TRIGGER shardq_turn_on_insert ON workflow_status; \
         INSERT INTO workflow_status (shard_key, queue, handler, job_group) \
             VALUES (3, 'old', 'noop', 'c'); \
         UPDATE shardq_functions SET sha256 = 'older' WHERE name = 'shardq_take_turn'",
    )
    .await
    .expect("a grouped job ready unnumbered");
    migrate_all(&shards).await.expect("migrate");
    let claim = "SELECT id FROM shardq_claim(1, 0, 'old', 10, 'w', 60000) WHERE id IS NOT NULL";
    let first = db.query(claim, &[]).await.expect("claim").len();
    assert_eq!(
        first, 4,
        "the numbered ones; the first claim makes the rounds"
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let second = db.query(claim, &[]).await.expect("claim").len();
    assert_eq!(second, 1, "numbered by the rounds' move, then claimed");
    check_all(&shards).await.expect("check after migrate");
}

/// Each (role, table, right) is granted or not as expected.
async fn assert_privileges(db: &tokio_postgres::Client, expected: &[(&str, &str, &str, bool)]) {
    for (role, table, right, granted) in expected {
        let found: bool = db
            .query_one(
                "SELECT has_table_privilege($1::text, $2::text, $3::text)",
                &[role, table, right],
            )
            .await
            .expect("privilege")
            .get(0);
        assert_eq!(found, *granted, "{role} {right} on {table}");
    }
}

/// Migration 47 turns the ready floors' and the grouped rounds' tables into
/// views of rows only added and deleted: a shard at version 46 keeps its
/// floors (one whose level was missing gets it) and rounds, and the roles
/// granted the old tables keep their rights: readers read the views, the
/// worker's claim (UPDATE of the floors before) adds and deletes the new
/// rows; the function files' views replace the migration's.
#[tokio::test]
async fn the_floors_and_rounds_of_a_shard_at_46_keep_their_values_and_their_roles() {
    let server = EphemeralServer::start().await.expect("server");
    let shards = migrated(&server, "shardq").await;
    let db = connect(&server, "shardq").await;
    db.batch_execute(
        "DROP VIEW shardq_ready_floors; DROP TABLE shardq_ready_floor_moves; \
         CREATE TABLE shardq_ready_floors (queue text NOT NULL, priority integer NOT NULL, \
             floor_seq bigint NOT NULL DEFAULT 0, keyed_floor_seq bigint NOT NULL DEFAULT 0, \
             PRIMARY KEY (queue, priority)); \
         INSERT INTO shardq_ready_levels VALUES ('old', 0); \
         INSERT INTO shardq_ready_floors VALUES ('old', 0, 7, 5), ('orphan', 1, 3, 2); \
         CREATE ROLE floor_mover; CREATE ROLE \"Floor Reader\"; \
         GRANT SELECT, UPDATE ON shardq_ready_floors TO floor_mover; \
         GRANT SELECT ON shardq_ready_floors TO \"Floor Reader\", PUBLIC; \
         DROP VIEW shardq_group_rounds; \
         DROP TABLE shardq_group_round_moves, shardq_group_queues; \
         CREATE TABLE shardq_group_rounds (queue text PRIMARY KEY, \
             round bigint NOT NULL DEFAULT 0, floor_turn bigint NOT NULL DEFAULT 0, \
             noted_round bigint); \
         INSERT INTO shardq_group_rounds VALUES ('grouped', 9, 4, 8), ('new', 0, 0, NULL); \
         GRANT SELECT ON shardq_group_rounds TO \"Floor Reader\"; \
         SELECT setval('shardq_ready_seq', 1000); \
         DELETE FROM shardq_migrations WHERE version = 47; \
         UPDATE shardq_functions SET sha256 = 'older' \
             WHERE name IN ('shardq_advance_ready_floors', 'shardq_ensure_floors', \
                 'shardq_move_group_rounds', 'shardq_group_floor'); \
         DELETE FROM shardq_functions \
             WHERE name IN ('shardq_ready_floor_of', 'shardq_group_round_of'); \
         DROP FUNCTION shardq_ready_floor_of; DROP FUNCTION shardq_group_round_of",
    )
    .await
    .expect("the floors as version 46 left them");
    migrate_all(&shards).await.expect("migrate");
    let floors: Vec<(String, i32, i64, i64)> = db
        .query(
            "SELECT queue, priority, floor_seq, keyed_floor_seq FROM shardq_ready_floors \
             ORDER BY queue",
            &[],
        )
        .await
        .expect("floors")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        floors,
        vec![("old".into(), 0, 7, 5), ("orphan".into(), 1, 3, 2)]
    );
    assert_privileges(
        &db,
        &[
            ("floor_mover", "shardq_ready_floors", "SELECT", true),
            ("floor_mover", "shardq_ready_floor_moves", "INSERT", true),
            ("floor_mover", "shardq_ready_floor_moves", "DELETE", true),
            ("Floor Reader", "shardq_ready_floors", "SELECT", true),
            ("Floor Reader", "shardq_ready_floor_moves", "INSERT", false),
            ("Floor Reader", "shardq_group_rounds", "SELECT", true),
            ("public", "shardq_ready_floors", "SELECT", true),
            ("public", "shardq_group_rounds", "SELECT", false),
        ],
    )
    .await;
    let rounds: Vec<(String, i64, i64, Option<i64>)> = db
        .query(
            "SELECT queue, round, floor_turn, noted_round FROM shardq_group_rounds \
             ORDER BY queue",
            &[],
        )
        .await
        .expect("rounds")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        rounds,
        vec![
            ("grouped".into(), 9, 4, Some(8)),
            ("new".into(), 0, 0, None)
        ]
    );
    for (view, reader) in [
        ("shardq_ready_floors", "shardq_ready_floor_of"),
        ("shardq_group_rounds", "shardq_group_round_of"),
    ] {
        let text: String = db
            .query_one(&format!("SELECT pg_get_viewdef('{view}')"), &[])
            .await
            .expect("the view")
            .get(0);
        assert!(
            text.contains(reader),
            "the functions' {view} replaced the migration's: {text}"
        );
    }
    // A move leaves a barrier, the next passes it and replaces the
    // migrated floor's row (move_seq 0).
    for _ in 0..2 {
        db.batch_execute("UPDATE shardq_ready_barrier SET advanced_at = '-infinity'")
            .await
            .expect("let the floors move");
        db.batch_execute("SELECT shardq_advance_ready_floors()")
            .await
            .expect("a move");
    }
    let old_rows: Vec<(i64, i64)> = db
        .query(
            "SELECT move_seq, floor_seq FROM shardq_ready_floor_moves WHERE queue = 'old'",
            &[],
        )
        .await
        .expect("the old floor's rows")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(old_rows.len(), 1, "one row: {old_rows:?}");
    assert!(old_rows[0].0 > 1000 && old_rows[0].1 > 1000, "{old_rows:?}");
    check_all(&shards).await.expect("check after migrate");
}

/// Migration 48 moves a rate's token bucket out of the limits row, and the
/// permit leases out of their table, into rows only added and deleted: a
/// shard at 47 keeps each bucket's state (a queue's first take since reads
/// the limits row's tokens: one start an hour here, so no refill within
/// the test) and each lease (another holder gets only what is left), and
/// the roles that could update the limits row or write the leases may
/// write the new rows, those that could read the leases read them.
#[tokio::test]
async fn the_rate_buckets_and_leases_of_a_shard_at_47_are_kept_by_migration_48() {
    let server = EphemeralServer::start().await.expect("server");
    let shards = migrated(&server, "shardq").await;
    let db = connect(&server, "shardq").await;
    db.batch_execute(
        "DROP TABLE shardq_rate_buckets, shardq_limit_holders, shardq_limit_lease_moves; \
         DROP SEQUENCE shardq_limit_lease_seq; \
         CREATE TABLE shardq_limit_leases (queue text NOT NULL, holder text NOT NULL, \
             permits integer NOT NULL CHECK (permits >= 0), \
             expires_at timestamptz NOT NULL, PRIMARY KEY (queue, holder)); \
         CREATE ROLE limit_worker; CREATE ROLE limit_reader; \
         GRANT SELECT, UPDATE ON shardq_queue_limits TO limit_worker; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON shardq_limit_leases TO limit_worker; \
         GRANT SELECT ON shardq_limit_leases TO limit_reader; \
         INSERT INTO shardq_queue_limits \
             (queue, concurrency, rate_count, rate_period_ms, revision, tokens, tokens_at) \
         VALUES ('full', NULL, 1, 3600000, 1, 1, now()), \
             ('empty', NULL, 1, 3600000, 1, 0, now()), \
             ('capped', 5, NULL, NULL, 1, 0, now()); \
         INSERT INTO shardq_limit_leases \
             VALUES ('capped', 'old-process', 3, now() + interval '1 hour'); \
         DELETE FROM shardq_migrations WHERE version IN (48, 49)",
    )
    .await
    .expect("the limits as version 47 kept them");
    migrate_all(&shards).await.expect("migrate");
    let take = "SELECT shardq_take_starts($1, 1)";
    for (queue, starts) in [("full", 1), ("empty", 0), ("full", 0)] {
        let got: i32 = db.query_one(take, &[&queue]).await.expect("take").get(0);
        assert_eq!(got, starts, "a take of {queue}");
    }
    let in_use = db
        .query_one(
            "SELECT queue, permits, holders FROM shardq_permits_in_use()",
            &[],
        )
        .await
        .expect("permits in use");
    assert_eq!(
        (
            in_use.get::<_, String>(0),
            in_use.get::<_, i64>(1),
            in_use.get::<_, i64>(2)
        ),
        ("capped".to_string(), 3, 1),
        "the old process's lease"
    );
    let granted: i32 = db
        .query_one(
            "SELECT granted FROM shardq_lease_permits('new-process', ARRAY['capped'], \
             ARRAY[5], 5000)",
            &[],
        )
        .await
        .expect("a lease")
        .get(0);
    assert_eq!(granted, 2, "what the old process's lease left");
    assert_privileges(
        &db,
        &[
            ("limit_worker", "shardq_rate_buckets", "INSERT", true),
            ("limit_worker", "shardq_rate_buckets", "DELETE", true),
            ("limit_worker", "shardq_limit_lease_moves", "INSERT", true),
            ("limit_worker", "shardq_limit_holders", "DELETE", true),
            ("limit_reader", "shardq_limit_lease_moves", "SELECT", true),
            ("limit_reader", "shardq_limit_holders", "SELECT", true),
            ("limit_reader", "shardq_limit_holders", "INSERT", false),
        ],
    )
    .await;
    let old_table: Option<String> = db
        .query_one("SELECT to_regclass('shardq_limit_leases')::text", &[])
        .await
        .expect("the old table")
        .get(0);
    assert_eq!(old_table, None, "49 dropped the old leases' table");
    check_all(&shards).await.expect("check after migrate");
}

/// Migration 49 keys the floors' barrier by its move's number, so that a
/// move adds a row and deletes the one it read instead of updating one.
/// This release's move also runs on the barrier as 47 left it (it does,
/// between 47 or 48, whose transaction applies the functions, and 49), from a
/// barrier that never moved (no number) too; 49 keeps the barrier's values,
/// and the roles that could update it may add and delete its rows.
#[tokio::test]
async fn the_barrier_of_a_shard_at_48_moves_before_and_after_migration_49() {
    let server = EphemeralServer::start().await.expect("server");
    let shards = migrated(&server, "shardq").await;
    let db = connect(&server, "shardq").await;
    db.batch_execute(
        "DROP TABLE shardq_ready_barrier; \
         CREATE TABLE shardq_ready_barrier ( \
             one_row boolean PRIMARY KEY DEFAULT true CHECK (one_row), \
             pending_seq bigint, pending_xid xid8, \
             advanced_at timestamptz NOT NULL DEFAULT '-infinity'); \
         INSERT INTO shardq_ready_barrier DEFAULT VALUES; \
         CREATE ROLE barrier_mover; \
         GRANT SELECT, UPDATE ON shardq_ready_barrier TO barrier_mover; \
         GRANT SELECT ON shardq_ready_barrier TO PUBLIC; \
         DELETE FROM shardq_migrations WHERE version = 49",
    )
    .await
    .expect("the barrier as versions 47 and 48 left it");
    let barrier = "SELECT count(*), max(pending_seq), \
                   max(advanced_at)::text || ' ' || max(pending_xid::text::int8) \
                   FROM shardq_ready_barrier";
    let mut last = None;
    for _ in 0..2 {
        db.batch_execute("UPDATE shardq_ready_barrier SET advanced_at = '-infinity'")
            .await
            .expect("let the floors move");
        db.batch_execute("SELECT shardq_advance_ready_floors()")
            .await
            .expect("a move on the barrier as 47 left it");
        let row = db.query_one(barrier, &[]).await.expect("the barrier");
        assert_eq!(row.get::<_, i64>(0), 1, "one row");
        let seq: Option<i64> = row.get(1);
        assert!(seq.is_some() && seq > last, "{last:?} -> {seq:?}");
        last = seq;
    }
    let kept: String = db.query_one(barrier, &[]).await.expect("barrier").get(2);

    migrate_all(&shards).await.expect("migrate");
    let row = db.query_one(barrier, &[]).await.expect("the barrier");
    assert_eq!(
        (
            row.get::<_, i64>(0),
            row.get::<_, Option<i64>>(1),
            row.get::<_, String>(2)
        ),
        (1, last, kept),
        "49 kept the barrier's values"
    );
    let barrier_table = "shardq_ready_barrier";
    assert_privileges(
        &db,
        &[
            ("barrier_mover", barrier_table, "INSERT", true),
            ("barrier_mover", barrier_table, "DELETE", true),
            ("barrier_mover", barrier_table, "UPDATE", true),
            ("public", barrier_table, "SELECT", true),
            ("public", barrier_table, "INSERT", false),
        ],
    )
    .await;
    db.batch_execute("UPDATE shardq_ready_barrier SET advanced_at = '-infinity'")
        .await
        .expect("let the floors move");
    db.batch_execute("SELECT shardq_advance_ready_floors()")
        .await
        .expect("a move after 49");
    let row = db.query_one(barrier, &[]).await.expect("the barrier");
    assert_eq!(row.get::<_, i64>(0), 1, "one row after 49");
    assert!(row.get::<_, Option<i64>>(1) > last);
    check_all(&shards).await.expect("check after migrate");
}

/// Migration 50 moves a group rate's buckets into rows only added and
/// deleted: a shard at 49 keeps each group's bucket (an empty one starts
/// nothing within the test, one start an hour; a group with none has a full
/// one), the next claim of a group numbers its row past the copied ones,
/// the roles keep their rights on the new rows, those that could write
/// them take their numbers, and the old table is gone.
#[tokio::test]
async fn the_group_buckets_of_a_shard_at_49_are_kept_by_migration_50() {
    let server = EphemeralServer::start().await.expect("server");
    let shards = migrated(&server, "shardq").await;
    let db = connect(&server, "shardq").await;
    db.batch_execute(
        "DROP TABLE shardq_group_buckets; DROP SEQUENCE shardq_group_bucket_seq; \
         CREATE TABLE shardq_group_tokens (queue text NOT NULL, job_group text NOT NULL, \
             tokens double precision NOT NULL, tokens_at timestamptz NOT NULL, \
             PRIMARY KEY (queue, job_group)); \
         CREATE ROLE bucket_worker; CREATE ROLE bucket_reader; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON shardq_group_tokens TO bucket_worker; \
         GRANT SELECT ON shardq_group_tokens TO bucket_reader; \
         INSERT INTO shardq_queue_limits \
             (queue, group_rate_count, group_rate_period_ms, revision) \
         VALUES ('tenants', 1, 3600000, 1); \
         INSERT INTO shardq_group_tokens VALUES ('tenants', 'empty', 0, now()), \
             ('tenants', 'spent', 0.5, now()); \
         DELETE FROM shardq_migrations WHERE version = 50",
    )
    .await
    .expect("the group buckets as version 49 kept them");
    migrate_all(&shards).await.expect("migrate");
    for group in ["empty", "spent", "fresh"] {
        db.query(
            "SELECT shardq_enqueue('tenants', 'noop', p_group => $1)",
            &[&group],
        )
        .await
        .expect("enqueue");
    }
    let claimed: Vec<String> = db
        .query(
            "SELECT w.job_group FROM shardq_claim(1, 0, 'tenants', 10, 'w', 60000) c \
             JOIN workflow_status w ON w.id = c.id",
            &[],
        )
        .await
        .expect("claim")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(claimed, ["fresh"], "only the group without a bucket row");
    let rows: Vec<(String, i64)> = db
        .query(
            "SELECT job_group, take_seq FROM shardq_group_buckets ORDER BY take_seq",
            &[],
        )
        .await
        .expect("buckets")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(
        rows[2].0, "fresh",
        "the claim's row is numbered last: {rows:?}"
    );
    let table = "shardq_group_buckets";
    assert_privileges(
        &db,
        &[
            ("bucket_worker", table, "INSERT", true),
            ("bucket_worker", table, "UPDATE", true),
            ("bucket_worker", table, "DELETE", true),
            ("bucket_reader", table, "SELECT", true),
            ("bucket_reader", table, "INSERT", false),
        ],
    )
    .await;
    let usage: bool = db
        .query_one(
            "SELECT has_sequence_privilege('bucket_worker', 'shardq_group_bucket_seq', 'USAGE')",
            &[],
        )
        .await
        .expect("sequence privilege")
        .get(0);
    assert!(usage, "the worker's role takes the rows' numbers");
    let old_table: Option<String> = db
        .query_one("SELECT to_regclass('shardq_group_tokens')::text", &[])
        .await
        .expect("the old table")
        .get(0);
    assert_eq!(old_table, None, "50 dropped the old buckets' table");
    check_all(&shards).await.expect("check after migrate");
}

/// Migration 51 makes the lease floor's table: owned as the jobs' table
/// is (not by the role that migrates), readable by the roles that read the
/// jobs, and written by those that may delete them (a worker's, whose
/// upkeep moves the floor), not by one that only updates them.
#[tokio::test]
async fn the_lease_floor_of_migration_51_belongs_to_the_jobs_owner_and_roles() {
    let server = EphemeralServer::start().await.expect("server");
    let shards = migrated(&server, "shardq").await;
    let db = connect(&server, "shardq").await;
    db.batch_execute(
        "DROP TABLE shardq_lease_floor_moves; \
         CREATE ROLE jobs_owner; CREATE ROLE lease_worker; CREATE ROLE lease_reader; \
         CREATE ROLE lease_producer; \
         ALTER TABLE workflow_status OWNER TO jobs_owner; \
         GRANT SELECT, UPDATE, DELETE ON workflow_status TO lease_worker; \
         GRANT SELECT, INSERT, UPDATE ON workflow_status TO lease_producer; \
         GRANT SELECT ON workflow_status TO lease_reader; \
         DELETE FROM shardq_migrations WHERE version = 51",
    )
    .await
    .expect("a shard at 50 with its own roles");
    migrate_all(&shards).await.expect("migrate");
    let owner: String = db
        .query_one(
            "SELECT relowner::regrole::text FROM pg_class \
             WHERE oid = 'shardq_lease_floor_moves'::regclass",
            &[],
        )
        .await
        .expect("the owner")
        .get(0);
    assert_eq!(owner, "jobs_owner");
    let table = "shardq_lease_floor_moves";
    assert_privileges(
        &db,
        &[
            ("lease_worker", table, "SELECT", true),
            ("lease_worker", table, "INSERT", true),
            ("lease_worker", table, "DELETE", true),
            ("lease_producer", table, "SELECT", true),
            ("lease_producer", table, "INSERT", false),
            ("lease_producer", table, "DELETE", false),
            ("lease_reader", table, "SELECT", true),
            ("lease_reader", table, "INSERT", false),
        ],
    )
    .await;
    check_all(&shards).await.expect("check after migrate");
}

/// Migration 52 lets every role that reads the jobs read the grouped
/// floors (the backlog counts grouped jobs from them): a producer's role
/// made before it, which could not, can; one that may not read the jobs
/// still cannot.
#[tokio::test]
async fn migration_52_lets_the_readers_of_the_jobs_read_the_grouped_floors() {
    let server = EphemeralServer::start().await.expect("server");
    let shards = migrated(&server, "shardq").await;
    let db = connect(&server, "shardq").await;
    db.batch_execute(
        "CREATE ROLE rounds_producer; CREATE ROLE rounds_stranger; \
         GRANT SELECT, INSERT, UPDATE ON workflow_status TO rounds_producer; \
         DELETE FROM shardq_migrations WHERE version = 52",
    )
    .await
    .expect("a shard at 51 with a producer's role");
    let view = "shardq_group_rounds";
    assert_privileges(&db, &[("rounds_producer", view, "SELECT", false)]).await;
    migrate_all(&shards).await.expect("migrate");
    assert_privileges(
        &db,
        &[
            ("rounds_producer", view, "SELECT", true),
            ("rounds_stranger", view, "SELECT", false),
        ],
    )
    .await;
    // The view reads its tables with its owner's rights (the role needs
    // nothing more to read it).
    db.batch_execute(
        "SET ROLE rounds_producer; SELECT count(*) FROM shardq_group_rounds; RESET ROLE",
    )
    .await
    .expect("the producer's role reads the grouped floors");
    check_all(&shards).await.expect("check after migrate");
}

/// Migrations 47, 48 and 50 apply the functions in their own transaction:
/// the old ones cannot write the views 47 leaves, would write the leases
/// 48 moves where no one reads them, and read the group buckets 50 drops,
/// so no later migration of a run may come between any of them and them.
/// The mark counts only as a first line: one written anywhere else would
/// be ignored, so none is.
#[test]
fn migrations_47_48_and_50_apply_the_functions_with_them() {
    let marked: Vec<i32> = MIGRATIONS
        .iter()
        .filter(|m| m.applies_functions())
        .map(|m| m.version)
        .collect();
    assert_eq!(marked, [47, 48, 50]);
    for m in MIGRATIONS {
        assert!(
            !m.sql
                .lines()
                .skip(1)
                .any(|l| l.contains("shardq:functions-with-this")),
            "{}: the mark is not its first line",
            m.name
        );
    }
}

/// An upgraded shard of a list of three records epoch 1 of the versioned
/// map: exactly the ranges of the formula it routed by.
#[tokio::test]
async fn the_upgrade_records_the_formula_ranges_as_epoch_1() {
    let server = EphemeralServer::start().await.expect("server");
    load_fixture(&server).await;
    // The fixture is a list of one; make it the first shard of three.
    connect(&server, "upgraded")
        .await
        .batch_execute("UPDATE shardq_shard_map SET shard_count = 3, shard_index = 0")
        .await
        .expect("place");
    let shards = pools(&server, "upgraded");
    assert_eq!(
        crate::store::map::current(shards.get(0))
            .await
            .expect("read"),
        None
    );
    migrate_shard(shards.get(0), 3).await.expect("migrate");
    let recorded = crate::store::map::current(shards.get(0))
        .await
        .expect("read")
        .expect("epoch 1 recorded");
    let formula = crate::shard_map::ShardMap::from_formula(3);
    assert_eq!(recorded.epoch, 1);
    assert_eq!(recorded.shard_count, 3);
    assert_eq!(recorded.ranges, formula.ranges());
}
