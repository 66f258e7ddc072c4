//! Each bad configuration gives an error that names the key and says what to fix.

use figment::providers::Format;
use shardq::config::{Config, ConfigError, DequeueMode};
use std::time::Duration;

const ONE_SHARD: &str =
    "[[shards]]\nname = \"a\"\nurl = \"postgres://app:s3cret-pw@db.example:5432/q\"\n";

fn err(text: &str) -> String {
    match Config::from_toml(text) {
        Ok(_) => panic!("config should be rejected:\n{text}"),
        Err(e) => shardq::error_chain(&e),
    }
}

#[test]
fn a_good_config_parses_with_defaults() {
    let config = Config::from_toml(ONE_SHARD).unwrap();
    assert_eq!(config.shards.len(), 1);
    assert_eq!(config.dequeue.mode, DequeueMode::Gated { slots: 2 });
    assert_eq!(config.shards[0].pg.get_dbname(), Some("q"));
}

#[test]
fn the_committed_shards_toml_is_valid_and_has_four_local_shards() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/shards.toml")).unwrap();
    let config = Config::from_toml(&text).unwrap();
    assert_eq!(config.shards.len(), 4);
    assert_eq!(config.local.shards, 4);
}

#[test]
fn no_shards_key_means_local_shards() {
    let config = Config::from_toml("[local]\nshards = 3\nbase_port = 6000\n").unwrap();
    assert_eq!(config.shards.len(), 3);
    assert_eq!(config.shards[2].pg.get_ports(), &[6002]);
}

#[test]
fn unknown_keys_are_named() {
    let e = err(&format!("{ONE_SHARD}[dequeue]\nslots = 2\n"));
    assert!(e.contains("slots") && e.contains("dequeue"), "{e}");
    let e = err(&format!("{ONE_SHARD}colour = \"red\"\n"));
    assert!(e.contains("colour"), "{e}");
}

#[test]
fn duplicate_shard_names_are_rejected() {
    let e = err(&format!("{ONE_SHARD}{ONE_SHARD}"));
    assert!(e.contains("the name `a` is used twice"), "{e}");
}

#[test]
fn zero_shards_are_rejected() {
    let e = err("shards = []\n");
    assert!(e.contains("`shards` is empty"), "{e}");
}

#[test]
fn zero_slots_are_rejected() {
    let e = err(&format!("{ONE_SHARD}[dequeue]\nslots_per_shard = 0\n"));
    assert!(
        e.contains("dequeue.slots_per_shard") && e.contains("at least 1"),
        "{e}"
    );
}

#[test]
fn a_wake_cooldown_longer_than_the_fallback_poll_is_rejected() {
    let e = err(&format!(
        "{ONE_SHARD}[dequeue]\nidle_poll_ms = 3000\nwake_cooldown_ms = 60000\n"
    ));
    assert!(
        e.contains("dequeue.wake_cooldown_ms") && e.contains("idle_poll_ms"),
        "{e}"
    );
    let ok = Config::from_toml(&format!("{ONE_SHARD}[dequeue]\nwake_cooldown_ms = 10\n")).unwrap();
    assert_eq!(
        ok.dequeue.wake_cooldown,
        std::time::Duration::from_millis(10)
    );
}

#[test]
fn a_claim_budget_ceiling_outside_its_floor_and_the_statement_deadline_is_rejected() {
    for bad in ["50", "20000"] {
        let e = err(&format!(
            "{ONE_SHARD}[dequeue]\nstatement_timeout_ms = 10000\nclaim_budget_max_ms = {bad}\n"
        ));
        assert!(e.contains("dequeue.claim_budget_max_ms"), "{e}");
    }
    let ok = Config::from_toml(&format!(
        "{ONE_SHARD}[dequeue]\nclaim_budget_max_ms = 2000\n"
    ))
    .unwrap();
    assert_eq!(
        ok.dequeue.claim_budget_max,
        std::time::Duration::from_millis(2000)
    );
    let default = Config::from_toml(ONE_SHARD).unwrap();
    assert_eq!(
        default.dequeue.claim_budget_max,
        std::time::Duration::from_millis(250)
    );
}

#[test]
fn unparsable_urls_are_rejected_with_the_shard_named() {
    let e = err("[[shards]]\nname = \"broken\"\nurl = \"postgres://u@h:notaport/db\"\n");
    assert!(e.contains("shards[0].url (shard `broken`)"), "{e}");
    assert!(
        e.contains("postgres://user:password@host:port/dbname"),
        "{e}"
    );
}

#[test]
fn url_and_host_together_are_rejected() {
    let e = err("[[shards]]\nname = \"x\"\nurl = \"postgres://u@h/db\"\nhost = \"h\"\n");
    assert!(e.contains("give either `url` or `host`"), "{e}");
}

#[test]
fn wrong_types_and_bad_modes_are_named() {
    let e = err(&format!("{ONE_SHARD}[worker]\nconcurrency = \"many\"\n"));
    assert!(e.contains("concurrency"), "{e}");
    let e = err(&format!("{ONE_SHARD}[dequeue]\nmode = \"fast\"\n"));
    assert!(e.contains("dequeue.mode") && e.contains("gated"), "{e}");
    let e = err(&format!("{ONE_SHARD}[worker]\nbuffer_jobs = 10\n"));
    assert!(e.contains("worker.buffer_jobs"), "{e}");
}

#[test]
fn passwords_never_show_in_debug_output() {
    let config = Config::from_toml(ONE_SHARD).unwrap();
    let debug = format!("{config:?}");
    assert!(!debug.contains("s3cret-pw"), "{debug}");
    let parts = "[[shards]]\nname = \"p\"\nhost = \"h\"\npassword = \"hunter2-pw\"\n";
    let config = Config::from_toml(parts).unwrap();
    assert!(!format!("{config:?}").contains("hunter2-pw"));
    let raw: shardq::config::ConfigFile = figment::Figment::new()
        .merge(figment::providers::Toml::string(ONE_SHARD))
        .extract()
        .unwrap();
    assert!(!format!("{raw:?}").contains("s3cret-pw"));
}

#[test]
fn a_missing_config_file_is_named() {
    let e = Config::load(Some(std::path::Path::new("/nonexistent/shards.toml"))).unwrap_err();
    assert!(matches!(e, ConfigError::MissingFile(_)));
    assert!(e.to_string().contains("/nonexistent/shards.toml"));
}

/// An embedder's process started where no shards.toml is, with no file
/// given, must not quietly connect to localhost: `Config::load(None)` says
/// what to pass. The CLI falls back to the local shards, and says so.
#[test]
fn no_config_file_is_an_error_for_the_library_and_a_loud_fallback_for_the_cli() {
    let empty = tempfile::tempdir().unwrap();
    let embed = crate::examples::example("embed");
    let out = std::process::Command::new(embed)
        .current_dir(empty.path())
        .env_remove("SHARDQ_CONFIG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the example ran without shards: {stderr}"
    );
    assert!(stderr.contains("no shards.toml in"), "{stderr}");
    assert!(stderr.contains("Config::local()"), "{stderr}");

    let out = std::process::Command::new(shardq_harness::exe::shardq())
        .args(["local", "status"])
        .current_dir(empty.path())
        .env_remove("SHARDQ_CONFIG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no --config and no ./shards.toml: using the 4 local shards"),
        "{stderr}"
    );
}

/// Everything the subscriber writes, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `text` parsed with a subscriber that keeps what it logs.
fn parse_logged(text: &str) -> (Result<Config, ConfigError>, String) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let result = tracing::subscriber::with_default(subscriber, || Config::from_toml(text));
    let logged = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    (result, logged)
}

#[test]
fn timeouts_live_under_database_and_the_old_dequeue_keys_still_work_with_a_warning() {
    let (config, logged) = parse_logged(&format!(
        "{ONE_SHARD}[database]\nstatement_timeout_ms = 4000\nconnect_timeout_ms = 900\nlock_timeout_ms = 0\n"
    ));
    let config = config.unwrap();
    assert_eq!(
        config.database.statement_timeout,
        Duration::from_millis(4000)
    );
    assert_eq!(config.database.connect_timeout, Duration::from_millis(900));
    assert!(config.database.lock_timeout.is_zero());
    assert!(!logged.contains("deprecated"), "{logged}");

    let (config, logged) = parse_logged(&format!(
        "{ONE_SHARD}[dequeue]\nstatement_timeout_ms = 4000\n"
    ));
    assert_eq!(
        config.unwrap().database.statement_timeout,
        Duration::from_millis(4000)
    );
    assert!(
        logged.contains("WARN")
            && logged.contains("dequeue.statement_timeout_ms")
            && logged.contains("database.statement_timeout_ms"),
        "the warning names the old key and the new one: {logged}"
    );

    // Both, agreeing: no doubt which one runs.
    let both =
        format!("{ONE_SHARD}[database]\nlock_timeout_ms = 700\n[dequeue]\nlock_timeout_ms = 700\n");
    assert_eq!(
        Config::from_toml(&both).unwrap().database.lock_timeout,
        Duration::from_millis(700)
    );
    // Both, disagreeing: refused, naming both keys.
    let e = err(&format!(
        "{ONE_SHARD}[database]\nlock_timeout_ms = 700\n[dequeue]\nlock_timeout_ms = 300\n"
    ));
    assert!(
        e.contains("database.lock_timeout_ms = 700")
            && e.contains("dequeue.lock_timeout_ms = 300")
            && e.contains("remove dequeue.lock_timeout_ms"),
        "{e}"
    );
}

#[test]
fn errors_about_the_statement_deadline_cite_its_database_key() {
    let e = err(&format!(
        "{ONE_SHARD}[database]\nstatement_timeout_ms = 0\n"
    ));
    assert!(e.contains("database.statement_timeout_ms"), "{e}");
    let e = err(&format!("{ONE_SHARD}[dequeue]\nconnect_timeout_ms = 0\n"));
    assert!(e.contains("database.connect_timeout_ms"), "{e}");
    let e = err(&format!(
        "{ONE_SHARD}[database]\nstatement_timeout_ms = 200\n[dequeue]\nclaim_budget_max_ms = 250\n"
    ));
    assert!(e.contains("database.statement_timeout_ms"), "{e}");
    let timeout = shardq::ShardError::Timeout {
        shard: "a".into(),
        after: Duration::from_secs(1),
    };
    let text = timeout.to_string();
    assert!(
        text.contains("database.statement_timeout_ms") && !text.contains("dequeue."),
        "{text}"
    );
}

#[test]
fn the_dequeue_mode_is_one_of_two_names() {
    let config = Config::from_toml(&format!("{ONE_SHARD}[dequeue]\nmode = \"ungated\"\n")).unwrap();
    assert_eq!(config.dequeue.mode, DequeueMode::Ungated);
    let e = err(&format!("{ONE_SHARD}[dequeue]\nmode = \"Gated\"\n"));
    assert!(e.contains("dequeue.mode") && e.contains("ungated"), "{e}");
}
