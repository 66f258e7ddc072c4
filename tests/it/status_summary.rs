//! `shardq status` leads with the queues: one line per queue with its jobs
//! summed over every shard that answered, the oldest ready job and its
//! shard; a shard that does not answer is named, and the others' totals
//! are still given.

use crate::common;

use common::TestShards;
use serde_json::json;
use shardq::{Client, NewJob};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_sums_each_queue_over_the_shards_and_names_one_that_does_not_answer() {
    let mut shards = TestShards::servers(3).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml("")).unwrap();
    let config = shardq::Config::load(Some(&path)).unwrap();
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    // Keys spread the mail jobs over the three shards; sms ones are delayed.
    let mail = (0..60)
        .map(|i| NewJob::new("mail", "noop", json!({})).ordering_key(format!("k{i}")))
        .collect();
    let ids = client.enqueue_many(mail).await.unwrap();
    let sms = (0..5)
        .map(|_| NewJob::new("sms", "noop", json!({})).delay(Duration::from_secs(3600)))
        .collect();
    client.enqueue_many(sms).await.unwrap();
    let on_last = ids
        .iter()
        .filter(|id| set.for_key(id.shard_key).name == "s2")
        .count();
    assert!(on_last > 0 && on_last < 60, "{on_last} of 60 on s2");

    let (ok, text) = shardq_harness::exe::shardq_output(&path, &["status", "--json"]).await;
    assert!(ok, "{text}");
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    let queue = |report: &serde_json::Value, name: &str| {
        report["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["queue"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {report}"))
    };
    // Each line here is that queue's sum over the shards' own counts.
    let mail_all = queue(&all, "mail");
    let per_shard: i64 = all["shards"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["counts"].as_array().unwrap().clone())
        .filter(|c| c["queue"] == "mail" && c["status"] == "queued")
        .map(|c| c["count"].as_i64().unwrap())
        .sum();
    assert_eq!(mail_all["counts"]["queued"], 60, "{mail_all}");
    assert_eq!(per_shard, 60);
    assert_eq!(mail_all["shards"], 3);
    assert!(mail_all["oldest_on"].is_string(), "{mail_all}");
    assert_eq!(queue(&all, "sms")["counts"]["delayed"], 5);
    assert_eq!(all["unanswered"], json!([]));

    // The third server stops: the others' totals, and the shard named.
    drop(shards.servers.remove(2));
    let (ok, text) = shardq_harness::exe::shardq_output(&path, &["status", "--json"]).await;
    assert!(ok, "{text}");
    let partial: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(partial["unanswered"], json!(["s2"]));
    assert_eq!(
        queue(&partial, "mail")["counts"]["queued"],
        60 - on_last as i64
    );
    let (ok, text) = shardq_harness::exe::shardq_output(&path, &["status"]).await;
    assert!(ok, "{text}");
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("queue") && first.contains("ready"),
        "{text}"
    );
    assert!(text.contains("2 of 3 shards answered"), "{text}");
    assert!(
        text.contains("s2 (") && text.contains("no answer"),
        "{text}"
    );
}
