//! What an embedder reaches through the public API alone (no `store`):
//! configuration made in code and from the environment, the kind of a
//! client error, a failed encoding told apart from a lost reply, the
//! enqueue time on a job's context, and a migration that waits for a
//! server that is starting.

use crate::common;

use common::TestShards;
use shardq::{ErrorKind, Shardq};

/// A value the client cannot encode (text bound to an `int` parameter) fails
/// before the statement is sent: it did not run, and it fails the same way
/// again, so it must not read as "no answer, may have run".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_fails_to_encode_is_permanent_not_a_lost_reply() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let shardq = Shardq::connect(config).unwrap();
    let shard = shardq.shards().get(0);
    let client = shard.client().await.unwrap();
    let refused = client
        .query("SELECT $1::int", &[&"not a number"])
        .await
        .expect_err("text does not encode as int");
    let err = shard.query_error(refused);
    assert_eq!(err.kind(), ErrorKind::Conversion, "{err:?}");
    assert!(err.is_permanent());
    // The connection is fine: the next statement on it runs.
    let row = client.query_one("SELECT 1::int", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
}

#[test]
fn a_config_is_made_in_code_from_one_url_or_a_builder() {
    let one = shardq::Config::single("postgres://app@db.example:5433/jobs").unwrap();
    assert_eq!(one.shards.len(), 1);
    assert_eq!(one.shards[0].name, shardq::config::SINGLE_SHARD_NAME);
    assert_eq!(one.shards[0].pg.get_ports(), &[5433]);
    assert_eq!(one.shards[0].pg.get_dbname(), Some("jobs"));

    let built = shardq::Config::builder()
        .shard("a", "postgres://app@db-a:5432/jobs")
        .shard("b", "postgres://app@db-b:5432/jobs")
        .queues(["emails", "reports"])
        .set(|file| file.database.statement_timeout_ms = Some(4_000))
        .build()
        .unwrap();
    let names: Vec<_> = built.shards.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a", "b"], "the calls' order is the shard map's");
    assert_eq!(built.worker.queues, ["emails", "reports"]);
    assert_eq!(
        built.database.statement_timeout,
        std::time::Duration::from_secs(4)
    );

    // Checked as a file is: a bad URL is named.
    let e = shardq::Config::single("postgres://app@db:notaport/jobs").unwrap_err();
    assert!(
        matches!(e, shardq::ConfigError::BadUrl { ref name, .. } if name == "shard0"),
        "{e}"
    );
}

/// `from_toml` reads `SHARDQ_*` over the text, as `load` does over the file.
/// (The variable is set for the whole test process: no other test here
/// reads `retention.batch`.)
#[test]
fn from_toml_honours_shardq_variables() {
    std::env::set_var("SHARDQ_RETENTION__BATCH", "77");
    let config = shardq::Config::from_toml(
        "[[shards]]\nname = \"a\"\nurl = \"postgres://app@db:5432/q\"\n[retention]\nbatch = 5\n",
    );
    std::env::remove_var("SHARDQ_RETENTION__BATCH");
    assert_eq!(config.unwrap().retention.batch, 77);
}

#[test]
fn the_library_names_its_version() {
    assert_eq!(shardq::VERSION, env!("CARGO_PKG_VERSION"));
    assert!(!shardq::VERSION.is_empty());
}

/// `ClientError::kind` answers without a nested match: a shard that is not
/// there is `Unreachable`; a job that is not there is about the job, not
/// the shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_error_says_its_kind() {
    // Port 1 on loopback: nothing listens there, the connection is refused.
    let config = shardq::Config::builder()
        .shard("gone", "postgres://nobody@127.0.0.1:1/none")
        .set(|f| f.database.connect_timeout_ms = Some(2_000))
        .build()
        .unwrap();
    let client = shardq::Client::new(&config).unwrap();
    let id = shardq::JobId {
        shard_key: 1,
        id: 1,
    };
    let err = client.job(id).await.expect_err("nothing listens there");
    assert_eq!(err.kind(), Some(ErrorKind::Unreachable), "{err:?}");

    let shards = TestShards::databases(1).await;
    let shardq = Shardq::connect(shards.config("")).unwrap();
    shardq.migrate().await.unwrap();
    let err = shardq
        .client()
        .result(id, std::time::Duration::from_millis(10))
        .await
        .expect_err("no such job");
    assert!(matches!(err, shardq::ClientError::NotFound(_)), "{err:?}");
    assert_eq!(err.kind(), None);
}

/// A handler sees when its job was enqueued: the row's `created_at`, by the
/// shard's clock, the same on a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_sees_when_its_job_was_enqueued() {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, SystemTime};
    let shards = TestShards::databases(1).await;
    let config = shards.config(
        "[worker]\nqueues = [\"seen\"]\nretry_backoff_min_ms = 10\nretry_backoff_max_ms = 20\nmaintenance_interval_ms = 100\n",
    );
    let shardq = Shardq::connect(config).unwrap();
    shardq.migrate().await.unwrap();
    let before = SystemTime::now();
    let id = shardq
        .client()
        .enqueue(shardq::NewJob::new("seen", "twice", serde_json::json!({})).max_attempts(2))
        .await
        .unwrap();
    let after = SystemTime::now();

    let seen: Arc<Mutex<Vec<(i32, SystemTime, SystemTime)>>> = Arc::default();
    let mut handlers = shardq::HandlerRegistry::new();
    let record = seen.clone();
    handlers.register("twice", move |ctx| {
        let record = record.clone();
        async move {
            record
                .lock()
                .unwrap()
                .push((ctx.attempt, ctx.enqueued_at, SystemTime::now()));
            if ctx.attempt == 1 {
                return Err("first attempt fails".into());
            }
            Ok(serde_json::Value::Null)
        }
    });
    shardq
        .worker(handlers)
        .stop_when_empty(true)
        .run(tokio_util::sync::CancellationToken::new())
        .await;
    let outcome = shardq
        .client()
        .result(id, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        matches!(outcome, shardq::JobOutcome::Succeeded(_)),
        "{outcome:?}"
    );

    let seen = seen.lock().unwrap();
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2]);
    // Server and test share this machine's clock; a second covers rounding.
    let slack = Duration::from_secs(1);
    for (attempt, enqueued_at, started) in seen.iter() {
        assert!(
            *enqueued_at + slack >= before && *enqueued_at <= after + slack,
            "attempt {attempt}: enqueued_at {enqueued_at:?} is not the enqueue's time ({before:?}..{after:?})"
        );
        assert!(enqueued_at <= started, "attempt {attempt}");
    }
    assert_eq!(seen[0].1, seen[1].1, "the same enqueue time on the retry");
}

/// `migrate_within` started while the shard's server is down waits for it:
/// the server starts later, and the migration then completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_waits_for_a_server_that_starts_later() {
    use std::time::Duration;
    let shards = TestShards::servers(1).await;
    let server = &shards.servers[0];
    server.stop(shardq_local::StopMode::Fast).unwrap();
    let shardq = Shardq::connect(shards.config("[database]\nconnect_timeout_ms = 1000\n")).unwrap();

    let migrating = {
        let shardq = shardq.clone();
        // Generous: CI shares two cores between builds.
        tokio::spawn(async move { shardq.migrate_within(Duration::from_secs(120)).await })
    };
    // Long enough for several refused tries (pauses start at 100 ms).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !migrating.is_finished(),
        "migrate gave up (or finished) while the server was down"
    );
    server.start_again().unwrap();
    migrating
        .await
        .unwrap()
        .expect("migrated once the server was up");
    shardq.check().await.expect("the shard is at this version");
}

/// The wait is bounded, and its error says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_gives_up_on_a_server_that_never_starts_with_a_clear_error() {
    use std::time::Duration;
    let config = shardq::Config::builder()
        .shard("gone", "postgres://nobody@127.0.0.1:1/none")
        .set(|f| f.database.connect_timeout_ms = Some(500))
        .build()
        .unwrap();
    let shardq = Shardq::connect(config).unwrap();
    let err = shardq
        .migrate_within(Duration::from_millis(800))
        .await
        .expect_err("nothing listens there");
    assert!(
        matches!(err, shardq::MigrateError::NotReady { waited, .. } if waited == Duration::from_millis(800)),
        "{err:?}"
    );
    let text = shardq::error_chain(&err);
    assert!(
        text.contains("did not accept connections within 800ms") && text.contains("gone"),
        "{text}"
    );
}
