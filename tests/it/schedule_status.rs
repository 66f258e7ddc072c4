//! `shardq status` lists each schedule under the shard its name routes to,
//! with its recorded last tick and its next tick (`--json` too).

use crate::common;

use chrono::{TimeZone, Utc};
use common::TestShards;
use shardq::store::schedules;
use std::process::{Command, Output};

const SCHEDULES: &str = "
[[schedules]]
name = \"new-year\"
cron = \"0 0 1 1 *\"
timezone = \"Europe/Berlin\"
queue = \"greetings\"
handler = \"noop\"
missed = \"run_once\"

[[schedules]]
name = \"never-run\"
cron = \"@daily\"
queue = \"q\"
handler = \"noop\"
";

fn shardq(config: &std::path::Path, args: &[&str]) -> Output {
    let out = Command::new(shardq_harness::exe::shardq())
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run shardq");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_last_and_next_tick_of_each_schedule() {
    let shards = TestShards::databases(2).await;
    let config = shards.config(SCHEDULES);
    let set = shards.migrated(&config).await;
    let new_year = &config.schedules[0];
    let home = set.for_key(new_year.shard_key());
    // Midnight of January 1st in Berlin is 23:00 UTC the day before.
    let last = Utc.with_ymd_and_hms(2025, 12, 31, 23, 0, 0).unwrap();
    assert!(schedules::register(home, "new-year", last).await.unwrap());
    let next = new_year.next_after(Utc::now()).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml(SCHEDULES)).unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&shardq(&path, &["status", "--json"]).stdout).unwrap();
    let listed: Vec<(usize, serde_json::Value)> = json["shards"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .flat_map(|(i, shard)| {
            let schedules = shard["schedules"].as_array().unwrap().clone();
            schedules.into_iter().map(move |s| (i, s))
        })
        .collect();
    assert_eq!(listed.len(), 2, "{json}");
    let (shard, s) = listed
        .iter()
        .find(|(_, s)| s["name"] == "new-year")
        .unwrap();
    assert_eq!(*shard, home.index);
    assert_eq!(s["last_tick"], "2025-12-31T23:00:00Z", "{s}");
    assert_eq!(
        s["next_tick"],
        next.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    assert_eq!(s["timezone"], "Europe/Berlin");
    assert_eq!(s["missed"], "run_once");
    let (_, never) = listed
        .iter()
        .find(|(_, s)| s["name"] == "never-run")
        .unwrap();
    assert!(
        never["last_tick"].is_null() && never["next_tick"].is_string(),
        "{never}"
    );

    let text = String::from_utf8(shardq(&path, &["status"]).stdout).unwrap();
    assert!(
        text.contains("schedule new-year (0 0 1 1 * Europe/Berlin, queue greetings, missed: run_once): last tick 2025-12-31T23:00:00Z, next tick"),
        "{text}"
    );
    assert!(text.contains("schedule never-run"), "{text}");
}
