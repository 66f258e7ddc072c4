//! Prometheus metrics end to end: the real `shardq worker --metrics-addr`
//! process and the real `shardq metrics` exporter, scraped over HTTP on
//! loopback, their exposition parsed and compared with what happened.

use crate::common;

use common::{wait_until, TestShards};
use nix::sys::signal::Signal;
use shardq::router::{shard_index, shard_key_for};
use shardq::{Client, NewJob};
use shardq_local::StopMode;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One sample of an exposition: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses Prometheus text: skips comments, splits `name{k="v",…} value`.
/// Label values here hold no quote, comma or brace.
fn parse(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample line has a value");
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("labels end with }");
                let labels = body
                    .split(',')
                    .filter(|kv| !kv.is_empty())
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').expect("label k=v");
                        (k.to_string(), v.trim_matches('"').to_string())
                    })
                    .collect();
                (name, labels)
            }
            None => (series, BTreeMap::new()),
        };
        let value = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in `{line}`")),
        };
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    samples
}

/// The sum of the samples named `name` whose labels include `having`.
fn sum(samples: &[Sample], name: &str, having: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            having
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

/// `GET /metrics` over a plain TCP connection: the status line and the body.
async fn scrape(addr: SocketAddr) -> std::io::Result<(String, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or((response.as_str(), ""));
    let status = head.lines().next().unwrap_or_default().to_string();
    Ok((status, body.to_string()))
}

/// Scrapes until the endpoint answers 200 (the process is starting).
async fn scrape_ok(addr: SocketAddr) -> Vec<Sample> {
    for _ in 0..200 {
        if let Ok((status, body)) = scrape(addr).await {
            assert!(status.contains("200"), "scrape answered {status}: {body}");
            return parse(&body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nothing answered at http://{addr}/metrics");
}

fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

fn write_config(dir: &Path, shards: &TestShards, extra: &str) -> std::path::PathBuf {
    let path = dir.join("shards.toml");
    std::fs::write(&path, shards.toml(extra)).unwrap();
    path
}

/// Jobs by shard name and status, counted in the databases.
async fn db_counts(client: &Client, status: &str) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for shard in client.shards().all() {
        counts.insert(
            shard.name.clone(),
            common::count_on(shard, status).await.unwrap(),
        );
    }
    counts
}

/// Longer than the exporter's shard deadline (1.5 s) by far, much shorter
/// than the statement and connection deadlines (120 s): a scrape that hangs on a frozen
/// shard fails the test instead of hanging it.
const SCRAPE_HANG_GUARD: Duration = Duration::from_secs(20);

const SUCCEEDING: usize = 300;
/// Jobs for a handler the worker does not have: each attempt fails.
const DEAD_AT_ONCE: usize = 20;
const RETRIED_THEN_DEAD: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_endpoint_counts_what_happened_per_shard() {
    let shards = TestShards::databases(2).await;
    let extra = "[worker]\nqueues = [\"m\"]\nretry_backoff_min_ms = 10\n\
                 retry_backoff_max_ms = 20\nmaintenance_interval_ms = 100\n";
    let config = shards.config(extra);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set, config.limits.clone());
    let mut jobs: Vec<NewJob> = (0..SUCCEEDING)
        .map(|i| NewJob::new("m", "noop", serde_json::json!({ "i": i })))
        .collect();
    jobs.extend(
        (0..DEAD_AT_ONCE)
            .map(|_| NewJob::new("m", "not-registered", serde_json::json!({})).max_attempts(1)),
    );
    jobs.extend(
        (0..RETRIED_THEN_DEAD)
            .map(|_| NewJob::new("m", "not-registered", serde_json::json!({})).max_attempts(2)),
    );
    client.enqueue_many(jobs).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), &shards, extra);
    let addr = free_addr();
    let mut worker = shardq_harness::exe::shardq_command(&path)
        .args(["worker", "--metrics-addr", &addr.to_string()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();

    let dead = (DEAD_AT_ONCE + RETRIED_THEN_DEAD) as f64;
    wait_until(
        Duration::from_secs(60),
        "every job finished and counted",
        || async {
            let Ok((_, body)) = scrape(addr).await else {
                return false;
            };
            let samples = parse(&body);
            let outcome = |o| sum(&samples, "shardq_worker_outcomes_total", &[("outcome", o)]);
            outcome("succeeded") == SUCCEEDING as f64 && outcome("dead") == dead
        },
    )
    .await;
    let samples = scrape_ok(addr).await;
    let outcome = |o| sum(&samples, "shardq_worker_outcomes_total", &[("outcome", o)]);
    assert_eq!(outcome("succeeded"), SUCCEEDING as f64);
    assert_eq!(outcome("dead"), dead);
    assert_eq!(outcome("retrying"), RETRIED_THEN_DEAD as f64);
    assert_eq!(outcome("fenced"), 0.0);
    assert_eq!(outcome("cancelled"), 0.0);

    // Per shard, the counters agree with the rows each shard holds.
    let succeeded = db_counts(&client, "succeeded").await;
    let dead_rows = db_counts(&client, "dead").await;
    assert_eq!(succeeded.values().sum::<i64>(), SUCCEEDING as i64);
    for (shard, rows) in &succeeded {
        let on_shard = [("shard", shard.as_str()), ("outcome", "succeeded")];
        assert_eq!(
            sum(&samples, "shardq_worker_outcomes_total", &on_shard),
            *rows as f64,
            "succeeded on {shard}"
        );
        let on_shard = [("shard", shard.as_str()), ("outcome", "dead")];
        assert_eq!(
            sum(&samples, "shardq_worker_outcomes_total", &on_shard),
            dead_rows[shard] as f64,
            "dead on {shard}"
        );
    }
    assert!(
        succeeded.values().all(|n| *n > 0),
        "both shards had jobs: {succeeded:?}"
    );

    // Every attempt was claimed, started (pickup latency) and written
    // (completion lag); nothing is left buffered or running.
    let attempts = (SUCCEEDING + DEAD_AT_ONCE + 2 * RETRIED_THEN_DEAD) as f64;
    let queue_m = [("queue", "m")];
    assert_eq!(
        sum(&samples, "shardq_worker_claimed_jobs_total", &queue_m),
        attempts
    );
    assert!(sum(&samples, "shardq_worker_claims_total", &queue_m) >= 2.0);
    assert_eq!(
        sum(
            &samples,
            "shardq_worker_pickup_latency_seconds_count",
            &queue_m
        ),
        attempts
    );
    assert_eq!(
        sum(&samples, "shardq_worker_completion_lag_seconds_count", &[]),
        attempts
    );
    let inf = [("queue", "m"), ("le", "+Inf")];
    assert_eq!(
        sum(
            &samples,
            "shardq_worker_pickup_latency_seconds_bucket",
            &inf
        ),
        attempts
    );
    assert!(
        sum(
            &samples,
            "shardq_worker_claim_duration_seconds_count",
            &queue_m
        ) >= 2.0
    );
    assert_eq!(sum(&samples, "shardq_worker_buffered_jobs", &[]), 0.0);
    assert_eq!(sum(&samples, "shardq_worker_running_jobs", &[]), 0.0);

    let (status, body) = scrape_at(addr, "/other").await;
    assert!(status.contains("404"), "{status}: {body}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .expect("the worker stops on SIGTERM")
        .unwrap();
    assert!(exit.success(), "{exit}");
}

async fn scrape_at(addr: SocketAddr, path: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// An ordering key that routes to shard `index` of `count`.
fn key_on(index: usize, count: usize, n: usize) -> String {
    (0..)
        .map(|i| format!("k{n}-{i}"))
        .find(|k| shard_index(shard_key_for(k), count) == index)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exporter_reports_depth_age_and_a_shard_that_is_down() {
    let shards = TestShards::servers(2).await;
    // Statement and connection deadlines (a checkout's recycling check
    // included) far past the exporter's: only the exporter's own deadline can
    // end a scrape of a frozen shard in time.
    let extra = "[worker]\nqueues = [\"a\", \"b\"]\n[dequeue]\n\
                 statement_timeout_ms = 120000\nconnect_timeout_ms = 120000\n";
    let config = shards.config(extra);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set, config.limits.clone());
    // Known numbers per shard and queue: each job under a key of its own
    // that routes to the shard (keyed jobs stay `queued` until claimed).
    let wanted = [(0, "a", 5), (0, "b", 3), (1, "a", 7)];
    let mut jobs = Vec::new();
    for (shard, queue, n) in wanted {
        for i in 0..n {
            let key = key_on(shard, 2, jobs.len() * 100 + i);
            jobs.push(NewJob::new(queue, "noop", serde_json::json!({})).ordering_key(key));
        }
    }
    // And two delayed ones on shard 1, queue b.
    for i in 0..2 {
        let key = key_on(1, 2, 10_000 + i);
        jobs.push(
            NewJob::new("b", "noop", serde_json::json!({}))
                .ordering_key(key)
                .delay(Duration::from_secs(3600)),
        );
    }
    client.enqueue_many(jobs).await.unwrap();
    // Unkeyed jobs go to any shard: count where they went.
    let unkeyed: Vec<NewJob> = (0..20)
        .map(|_| NewJob::new("a", "noop", serde_json::json!({})))
        .collect();
    let unkeyed_ids = client.enqueue_many(unkeyed).await.unwrap();
    let unkeyed_on = |shard: usize| {
        unkeyed_ids
            .iter()
            .filter(|id| shard_index(id.shard_key, 2) == shard)
            .count() as f64
    };
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), &shards, extra);
    let addr = free_addr();
    let _exporter = shardq_harness::exe::shardq_command(&path)
        .args([
            "metrics",
            "--listen",
            &addr.to_string(),
            "--shard-timeout-ms",
            "1500",
        ])
        .spawn()
        .unwrap();

    let samples = scrape_ok(addr).await;
    let jobs = |shard: &str, queue: &str, state: &str| {
        let labels = [("shard", shard), ("queue", queue), ("state", state)];
        sum(&samples, "shardq_queue_jobs", &labels)
    };
    assert_eq!(sum(&samples, "shardq_shard_up", &[("shard", "s0")]), 1.0);
    assert_eq!(sum(&samples, "shardq_shard_up", &[("shard", "s1")]), 1.0);
    assert_eq!(jobs("s0", "a", "queued"), 5.0 + unkeyed_on(0));
    assert_eq!(jobs("s0", "b", "queued"), 3.0);
    assert_eq!(jobs("s1", "a", "queued"), 7.0 + unkeyed_on(1));
    assert_eq!(jobs("s1", "b", "queued"), 0.0, "configured queues read 0");
    assert_eq!(jobs("s1", "b", "delayed"), 2.0);
    assert_eq!(jobs("s0", "a", "running"), 0.0);
    let age = |shard, queue| {
        sum(
            &samples,
            "shardq_queue_oldest_ready_age_seconds",
            &[("shard", shard), ("queue", queue)],
        )
    };
    for (shard, queue) in [("s0", "a"), ("s0", "b"), ("s1", "a")] {
        let age = age(shard, queue);
        assert!((1.0..600.0).contains(&age), "{shard}/{queue}: {age} s");
    }
    assert_eq!(age("s1", "b"), 0.0, "no ready job: age 0");

    // One shard's server freezes (no answer, no error): the scrape answers
    // at the exporter's deadline per shard, long before the statement
    // deadline of the config, with that shard down.
    let frozen = shards.servers[1].server();
    frozen.signal_all(Signal::SIGSTOP).unwrap();
    let answered = tokio::time::timeout(SCRAPE_HANG_GUARD, scrape_ok(addr)).await;
    frozen.signal_all(Signal::SIGCONT).unwrap();
    let samples = answered.expect("the scrape answers while a shard is frozen");
    assert_eq!(sum(&samples, "shardq_shard_up", &[("shard", "s0")]), 1.0);
    assert_eq!(sum(&samples, "shardq_shard_up", &[("shard", "s1")]), 0.0);
    // The horizon too: read on s0, given up on s1 at the same deadline.
    let horizon_up = |shard| sum(&samples, "shardq_xmin_horizon_up", &[("shard", shard)]);
    assert_eq!((horizon_up("s0"), horizon_up("s1")), (1.0, 0.0));
    let held = |shard| {
        samples
            .iter()
            .any(|s| s.name == "shardq_oldest_xmin_age_seconds" && s.labels["shard"] == shard)
    };
    assert!(
        held("s0") && !held("s1"),
        "an age only for the shard that answered"
    );

    // One shard's server stops: the scrape still answers, that shard down.
    shards.servers[1].stop(StopMode::Immediate).unwrap();
    let samples = scrape_ok(addr).await;
    assert_eq!(sum(&samples, "shardq_shard_up", &[("shard", "s0")]), 1.0);
    assert_eq!(sum(&samples, "shardq_shard_up", &[("shard", "s1")]), 0.0);
    let labels = [("shard", "s0"), ("queue", "a"), ("state", "queued")];
    assert_eq!(
        sum(&samples, "shardq_queue_jobs", &labels),
        5.0 + unkeyed_on(0)
    );
    assert!(
        !samples
            .iter()
            .any(|s| s.name == "shardq_queue_jobs" && s.labels["shard"] == "s1"),
        "no depth is reported for a shard that is down"
    );
}
