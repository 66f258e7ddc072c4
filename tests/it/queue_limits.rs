//! Fleet-wide queue concurrency limits (`shardq limit`): three `shardq
//! worker` processes of 16 slots each on two shards, a queue limited to 5,
//! jobs of 200 ms. Asserted on the jobs' own rows: at no instant do more
//! than 5 of them lie between their claim (`started_at`) and their
//! outcome's write (`finished_at`), which brackets their handler runs.
//! A process SIGKILLed while holding permits: the others get them once
//! its lease lapses. A limit raised and lowered while running. A rate of
//! 20 starts a second across three processes and four shards.

use crate::common;

use common::{wait_until, TestShards};
use serde_json::json;
use shardq::shards::{Shard, ShardSet};
use shardq::{Client, NewJob};
use shardq_harness::lossy_proxy::LossyProxy;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

const LIMIT: usize = 5;
const WORKER_TOML: &str = "
[worker]
queues = [\"limited\"]
concurrency = 16
";

pub(crate) async fn cli(config: &Path, args: &[&str]) -> String {
    let (ok, text) = shardq_harness::exe::shardq_output(config, args).await;
    assert!(ok, "shardq {args:?}: {text}");
    text
}

pub(crate) fn workers(config: &Path, n: usize) -> Vec<tokio::process::Child> {
    (0..n)
        .map(|_| {
            shardq_harness::exe::shardq_command(config)
                .arg("worker")
                .spawn()
                .unwrap()
        })
        .collect()
}

/// (claimed, written) of every job of the queue on `shard`.
async fn spans(shard: &Shard) -> Vec<(SystemTime, Option<SystemTime>, String)> {
    let db = shard.client().await.unwrap();
    db.query(
        "SELECT started_at, finished_at, status FROM workflow_status \
         WHERE queue = 'limited' AND started_at IS NOT NULL",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// The most spans open at one instant (an end before a start at a tie).
pub(crate) fn most_at_once(spans: &[(SystemTime, SystemTime)]) -> usize {
    most_within(
        spans,
        SystemTime::UNIX_EPOCH,
        SystemTime::now() + Duration::from_secs(3600),
    )
}

/// The most spans open at one instant from `from` until `to`.
pub(crate) fn most_within(
    spans: &[(SystemTime, SystemTime)],
    from: SystemTime,
    to: SystemTime,
) -> usize {
    let mut edges: Vec<(SystemTime, i32)> = spans
        .iter()
        .flat_map(|(s, e)| [(*s, 1), (*e, -1)])
        .collect();
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (at, d) in edges {
        if at >= to {
            break;
        }
        if at >= from {
            most = most.max(open);
        }
        open += d;
        if at >= from {
            most = most.max(open);
        }
    }
    most.max(0) as usize
}

/// Migrated shards, a shards.toml naming them, pools and a client.
pub(crate) struct Fleet {
    _shards: TestShards,
    _dir: tempfile::TempDir,
    pub path: PathBuf,
    pub set: ShardSet,
    pub client: Client,
}

async fn fleet() -> Fleet {
    fleet_of(2).await
}

async fn fleet_of(shard_count: usize) -> Fleet {
    fleet_with(WORKER_TOML, shard_count).await
}

/// `shard_count` shards whose shards.toml ends with `worker_toml`.
pub(crate) async fn fleet_with(worker_toml: &str, shard_count: usize) -> Fleet {
    let shards = TestShards::databases(shard_count).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml(worker_toml)).unwrap();
    let config = shardq::Config::load(Some(&path)).unwrap();
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    Fleet {
        _shards: shards,
        _dir: dir,
        path,
        set,
        client,
    }
}

/// Every job's (claimed, written) span, all shards.
async fn all_spans(set: &ShardSet) -> Vec<(SystemTime, SystemTime)> {
    let mut all = Vec::new();
    for shard in set.all() {
        let on = spans(shard).await;
        all.extend(on.into_iter().filter_map(|(s, e, _)| Some((s, e?))));
    }
    all
}

async fn succeeded(set: &ShardSet) -> usize {
    let mut done = 0;
    for shard in set.all() {
        let on = spans(shard).await;
        done += on.iter().filter(|(_, _, s)| s == "succeeded").count();
    }
    done
}

async fn enqueue_sleeps(client: &Client, n: usize, ms: u64) {
    let jobs = (0..n)
        .map(|_| NewJob::new("limited", "sleep", json!({ "ms": ms })))
        .collect();
    client.enqueue_many(jobs).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_never_run_more_jobs_of_a_limited_queue_than_its_limit() {
    const JOBS: usize = 60;
    let f = fleet().await;
    let text = cli(
        &f.path,
        &["limit", "set", "--queue", "limited", "--concurrency", "5"],
    )
    .await;
    assert!(text.contains("concurrency 5 across the fleet"), "{text}");
    enqueue_sleeps(&f.client, JOBS, 200).await;
    let mut children = workers(&f.path, 3);

    wait_until(Duration::from_secs(90), "every job succeeded", || async {
        let mut done = 0;
        for shard in f.set.all() {
            done += spans(shard)
                .await
                .iter()
                .filter(|(_, _, s)| s == "succeeded")
                .count();
        }
        done == JOBS
    })
    .await;
    let listed = cli(&f.path, &["limit", "list"]).await;
    for child in &mut children {
        child.kill().await.unwrap();
    }

    let mut all = Vec::new();
    for shard in f.set.all() {
        let on = spans(shard).await;
        assert!(!on.is_empty(), "both shards had jobs");
        all.extend(on.into_iter().map(|(s, e, _)| (s, e.expect("finished"))));
    }
    let most = most_at_once(&all);
    eprintln!("at most {most} jobs of the queue at once; `limit list`: {listed}");
    assert!(
        most <= LIMIT,
        "{most} jobs of the queue were claimed and unfinished at once, over its limit of {LIMIT}"
    );
    assert!(most >= 2, "the jobs ran side by side ({most} at most)");
    assert!(listed.contains("limited\tconcurrency 5"), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_processs_permits_come_back_once_its_lease_lapses() {
    let f = fleet().await;
    cli(
        &f.path,
        &["limit", "set", "--queue", "limited", "--concurrency", "5"],
    )
    .await;
    // Ten jobs of an hour: the first process holds every permit.
    enqueue_sleeps(&f.client, 10, 3_600_000).await;
    let mut first = workers(&f.path, 1);
    let running = |f: &Fleet| {
        let set = f.set.clone();
        async move {
            let mut n = 0;
            for shard in set.all() {
                n += spans(shard)
                    .await
                    .iter()
                    .filter(|(_, _, s)| s == "running")
                    .count();
            }
            n
        }
    };
    wait_until(Duration::from_secs(30), "5 jobs run", || async {
        running(&f).await == LIMIT
    })
    .await;
    let listed = cli(&f.path, &["limit", "list"]).await;
    assert!(listed.contains("in use 5\tby 1 processes"), "{listed}");
    let metrics = shardq::prometheus::backlog::scrape_with_check(
        &f.client,
        &["limited".to_string()],
        &shardq::client::CheckOptions::default(),
    )
    .await;
    for line in [
        "shardq_queue_limit_concurrency{queue=\"limited\"} 5",
        "shardq_queue_limit_permits_in_use{queue=\"limited\"} 5",
    ] {
        assert!(metrics.contains(line), "{line} in the metrics:\n{metrics}");
    }
    first[0].kill().await.unwrap();

    // A second process: its jobs wait for the permits of the killed one,
    // whose jobs stay `running` until their own job lease expires.
    let _second = workers(&f.path, 1);
    wait_until(
        Duration::from_secs(30),
        "the second process runs jobs once the first one's permits lapse",
        || async {
            let owners = f
                .client
                .queue_limits()
                .await
                .unwrap()
                .first()
                .and_then(|l| l.holders);
            owners == Some(1) && running(&f).await > LIMIT
        },
    )
    .await;
}

/// A limit raised and then lowered while two processes run the queue:
/// before the raise at most the old limit ran; after it, more did (within
/// a second and a half, the workers renewing every half second); once the
/// jobs running when it was lowered finished, at most the new limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_raised_and_lowered_while_running_takes_effect() {
    // 4 jobs at 2, 66 at 6 (over 3 s), 20 at 1.
    const JOBS: usize = 90;
    const JOB_MS: u64 = 300;
    const FOLLOW: Duration = Duration::from_millis(1_500);
    let f = fleet().await;
    let set_limit = |n: usize| {
        let path = f.path.clone();
        async move {
            let n = n.to_string();
            cli(
                &path,
                &["limit", "set", "--queue", "limited", "--concurrency", &n],
            )
            .await;
            SystemTime::now()
        }
    };
    set_limit(2).await;
    enqueue_sleeps(&f.client, JOBS, JOB_MS).await;
    let mut children = workers(&f.path, 2);
    wait_until(Duration::from_secs(60), "4 jobs succeeded", || async {
        succeeded(&f.set).await >= 4
    })
    .await;
    let raised = set_limit(6).await;
    wait_until(Duration::from_secs(60), "70 jobs succeeded", || async {
        succeeded(&f.set).await >= 70
    })
    .await;
    let lowered = set_limit(1).await;
    wait_until(Duration::from_secs(90), "every job succeeded", || async {
        succeeded(&f.set).await == JOBS
    })
    .await;
    for child in &mut children {
        child.kill().await.unwrap();
    }

    let spans = all_spans(&f.set).await;
    let end = SystemTime::now();
    let before = most_within(&spans, SystemTime::UNIX_EPOCH, raised);
    let after_raise = most_within(&spans, raised + FOLLOW, lowered);
    let settled = lowered + FOLLOW + Duration::from_millis(JOB_MS);
    let after_lower = most_within(&spans, settled, end);
    eprintln!("at most at once: {before} before the raise, {after_raise} after it, {after_lower} after the lowering");
    assert!(before <= 2, "{before} at once under a limit of 2");
    assert!(
        after_raise > 2 && after_raise <= 6,
        "{after_raise} at once under a limit raised to 6"
    );
    assert!(
        after_lower <= 1,
        "{after_lower} at once under a limit lowered to 1"
    );
    assert!(most_at_once(&spans) <= 6);
}

/// 200 jobs of a queue limited to 20 starts a second, three processes on
/// four shards: no span of one second holds more than 26 claims (the
/// rate, its burst of 1, and a quarter of a second's starts for the
/// claims' timestamps: a start is taken from the home shard's bucket, then
/// claimed on a job's shard, as late as the host schedules it; on 2 cores
/// shared by three workers and four servers, and the rest of the suite,
/// starts taken late in a second land in the next: 24 were seen twice;
/// a rate applied per process would allow 60), and
/// the whole run lasts at least ~9.9 s, which no slack of timestamps lets
/// pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_across_processes_and_shards() {
    const JOBS: usize = 200;
    const RATE: usize = 20;
    let f = fleet_of(4).await;
    let text = cli(
        &f.path,
        &["limit", "set", "--queue", "limited", "--rate", "20/s"],
    )
    .await;
    assert!(text.contains("rate 20/s"), "{text}");
    enqueue_sleeps(&f.client, JOBS, 5).await;
    let mut children = workers(&f.path, 3);
    wait_until(Duration::from_secs(40), "every job succeeded", || async {
        succeeded(&f.set).await == JOBS
    })
    .await;
    for child in &mut children {
        child.kill().await.unwrap();
    }
    let mut starts: Vec<SystemTime> = all_spans(&f.set)
        .await
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    starts.sort();
    let window = Duration::from_secs(1);
    let busiest = (0..starts.len())
        .map(|i| {
            starts[i..]
                .iter()
                .take_while(|t| **t < starts[i] + window)
                .count()
        })
        .max()
        .unwrap_or(0);
    let span = starts[JOBS - 1].duration_since(starts[0]).unwrap();
    eprintln!("{JOBS} starts over {span:?}; at most {busiest} in one second");
    assert!(
        busiest <= RATE + 1 + RATE / 4,
        "{busiest} starts in one second under a rate of {RATE}/s"
    );
    assert!(
        span >= Duration::from_millis(9_400),
        "{JOBS} starts in {span:?}: faster than {RATE}/s allows"
    );
}

/// A change written by a process whose clock ran two minutes ahead (its
/// revision, the writer's clock, outranks every honest writer's for two
/// minutes), then `shardq limit set --concurrency 1` from this host: the
/// new limit is in force on every shard, because the database orders the
/// changes, not the writers' clocks (before the fix: it printed success
/// and changed nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_set_after_a_skewed_writers_change_takes_effect() {
    let f = fleet().await;
    for shard in f.set.all() {
        write_as_skewed_writer(shard).await;
    }
    cli(
        &f.path,
        &["limit", "set", "--queue", "limited", "--concurrency", "1"],
    )
    .await;
    assert_concurrency_everywhere(&f.set, 1).await;
    let shown = f.client.queue_limits().await.unwrap();
    assert_eq!(shown[0].limits.concurrency, Some(1));
}

/// The skewed writer's change reached only the second shard, and the
/// setter's read of that shard is lost (its connection closes unanswered):
/// the home orders the change below the skewed revision, which the second
/// shard keeps. Nothing later was written through the home, so the change
/// must still take effect there, reported set (before the fix: `limit set`
/// failed saying a later change had replaced it; before the database
/// ordered changes: it said set and changed nothing there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_set_after_a_skewed_write_its_read_missed_takes_effect() {
    let shards = TestShards::databases(2).await;
    let config = shards.config(WORKER_TOML);
    let set = shards.migrated(&config).await;
    write_as_skewed_writer(set.get(1)).await;
    let second = &shards.urls[1];
    let proxy = LossyProxy::start(shardq_harness::lossy_proxy::server_addr(second));
    proxy.set_drop_only(Some("FROM shardq_queue_limits ORDER BY queue"));
    proxy.set_drop_probability(1.0);
    let mut urls = shards.urls.clone();
    urls[1] = second.replace(
        &shardq_harness::lossy_proxy::server_addr(second).to_string(),
        &proxy.addr().to_string(),
    );
    let through = TestShards {
        servers: Vec::new(),
        urls,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, through.toml(WORKER_TOML)).unwrap();
    cli(
        &path,
        &["limit", "set", "--queue", "limited", "--concurrency", "1"],
    )
    .await;
    assert_concurrency_everywhere(&set, 1).await;
    assert!(proxy.dropped() > 0, "the read of the second shard was lost");
}

/// Writes `limited`'s limit on `shard` as a writer whose clock ran two
/// minutes ahead did (its revision, that clock in microseconds, outranks
/// every honest writer's for two minutes).
async fn write_as_skewed_writer(shard: &Shard) {
    let ahead_us = (SystemTime::now() + Duration::from_secs(120))
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    shard
        .client()
        .await
        .unwrap()
        .execute(
            "INSERT INTO shardq_queue_limits (queue, concurrency, revision) \
             VALUES ('limited', 50, $1)",
            &[&ahead_us],
        )
        .await
        .unwrap();
}

async fn assert_concurrency_everywhere(set: &ShardSet, limit: i32) {
    for shard in set.all() {
        let concurrency: Option<i32> = shard
            .client()
            .await
            .unwrap()
            .query_one(
                "SELECT concurrency FROM shardq_queue_limits WHERE queue = 'limited'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(concurrency, Some(limit), "on {}", shard.name);
    }
}
