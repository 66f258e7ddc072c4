//! `[[schedules]]` in `shards.toml`: a good entry becomes a typed schedule;
//! each bad one is an error that names the key and says what to fix.

use shardq::config::Config;
use shardq::Missed;

const ONE_SHARD: &str = "[[shards]]\nname = \"a\"\nurl = \"postgres://app@db.example:5432/q\"\n";

fn with(schedules: &str) -> String {
    format!("{ONE_SHARD}{schedules}")
}

fn err(schedules: &str) -> String {
    match Config::from_toml(&with(schedules)) {
        Ok(_) => panic!("config should be rejected:\n{schedules}"),
        Err(e) => shardq::error_chain(&e),
    }
}

const GOOD: &str = "
[[schedules]]
name = \"nightly-report\"
cron = \"30 2 * * *\"
timezone = \"Europe/Berlin\"
queue = \"reports\"
handler = \"report\"
payload = { kind = \"daily\", recipients = [\"ops\"] }
missed = \"run_once\"

[[schedules]]
name = \"heartbeat\"
cron = \"*/10 * * * * *\"
queue = \"default\"
handler = \"noop\"
";

#[test]
fn a_good_schedule_becomes_typed_values_with_defaults() {
    let config = Config::from_toml(&with(GOOD)).unwrap();
    let [nightly, heartbeat] = &config.schedules[..] else {
        panic!("two schedules: {:?}", config.schedules);
    };
    assert_eq!(nightly.name(), "nightly-report");
    assert_eq!(nightly.timezone(), chrono_tz::Europe::Berlin);
    assert_eq!(nightly.missed_policy(), Missed::RunOnce);
    assert_eq!(nightly.queue(), "reports");
    let job = nightly.job_for(chrono::Utc::now());
    assert_eq!(
        job.payload,
        serde_json::json!({ "kind": "daily", "recipients": ["ops"] })
    );
    assert_eq!(heartbeat.timezone(), chrono_tz::UTC, "UTC by default");
    assert_eq!(heartbeat.missed_policy(), Missed::Skip, "skip by default");
    assert_eq!(
        heartbeat.job_for(chrono::Utc::now()).payload,
        serde_json::json!({})
    );
    assert!(Config::from_toml(ONE_SHARD).unwrap().schedules.is_empty());
}

#[test]
fn a_bad_cron_expression_names_the_key_and_the_format() {
    let e =
        err("[[schedules]]\nname = \"x\"\ncron = \"every day\"\nqueue = \"q\"\nhandler = \"h\"\n");
    assert!(
        e.starts_with("schedules[0].cron (schedule `x`) is invalid"),
        "{e}"
    );
    assert!(
        e.contains("`every day` is not a cron expression; write 5 fields"),
        "{e}"
    );
    let e =
        err("[[schedules]]\nname = \"x\"\ncron = \"0 25 * * *\"\nqueue = \"q\"\nhandler = \"h\"\n");
    assert!(e.contains("schedules[0].cron"), "{e}");
}

#[test]
fn an_expression_that_never_fires_is_refused() {
    let e =
        err("[[schedules]]\nname = \"x\"\ncron = \"0 0 31 2 *\"\nqueue = \"q\"\nhandler = \"h\"\n");
    assert!(
        e.contains("schedules[0].cron") && e.contains("never matches"),
        "{e}"
    );
}

#[test]
fn an_unknown_time_zone_asks_for_an_iana_name() {
    let e = err(
        "[[schedules]]\nname = \"x\"\ncron = \"@daily\"\ntimezone = \"CEST+1\"\nqueue = \"q\"\nhandler = \"h\"\n",
    );
    assert!(e.starts_with("schedules[0].timezone (schedule `x`)"), "{e}");
    assert!(
        e.contains("unknown time zone `CEST+1`; use an IANA name"),
        "{e}"
    );
}

#[test]
fn a_duplicate_name_is_refused_at_the_second_entry() {
    let entry = "[[schedules]]\nname = \"x\"\ncron = \"@daily\"\nqueue = \"q\"\nhandler = \"h\"\n";
    let e = err(&format!("{entry}{entry}"));
    assert!(e.starts_with("schedules[1].name (schedule `x`)"), "{e}");
    assert!(
        e.contains("used twice; give every schedule a unique name"),
        "{e}"
    );
}

#[test]
fn an_unknown_missed_policy_lists_the_policies() {
    let e = err(
        "[[schedules]]\nname = \"x\"\ncron = \"@daily\"\nmissed = \"catch_up\"\nqueue = \"q\"\nhandler = \"h\"\n",
    );
    assert!(e.starts_with("schedules[0].missed"), "{e}");
    assert!(e.contains("use \"skip\" or \"run_once\""), "{e}");
}

#[test]
fn empty_names_and_oversized_payloads_are_refused() {
    let e = err("[[schedules]]\nname = \"x\"\ncron = \"@daily\"\nqueue = \"\"\nhandler = \"h\"\n");
    assert!(e.starts_with("schedules[0].queue"), "{e}");
    let e = err("[[schedules]]\nname = \"x\"\ncron = \"@daily\"\nqueue = \"q\"\nhandler = \"\"\n");
    assert!(e.starts_with("schedules[0].handler"), "{e}");
    let e = err("[[schedules]]\nname = \"\"\ncron = \"@daily\"\nqueue = \"q\"\nhandler = \"h\"\n");
    assert!(e.starts_with("schedules[0].name"), "{e}");
    let big = "a".repeat(200);
    let e = err(&format!(
        "[limits]\nmax_payload_bytes = 100\n[[schedules]]\nname = \"x\"\ncron = \"@daily\"\nqueue = \"q\"\nhandler = \"h\"\npayload = {{ text = \"{big}\" }}\n"
    ));
    assert!(e.starts_with("schedules[0].payload"), "{e}");
    assert!(e.contains("over limits.max_payload_bytes = 100"), "{e}");
}

#[test]
fn a_missing_or_unknown_key_is_named() {
    let e = err("[[schedules]]\nname = \"x\"\nqueue = \"q\"\nhandler = \"h\"\n");
    assert!(e.contains("cron"), "{e}");
    let e = err(
        "[[schedules]]\nname = \"x\"\ncron = \"@daily\"\nqueue = \"q\"\nhandler = \"h\"\nevery = \"1h\"\n",
    );
    assert!(e.contains("every"), "{e}");
}
