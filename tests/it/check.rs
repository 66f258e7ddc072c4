//! `Client::check`: each invariant broken on purpose (direct SQL on a test
//! shard) is reported, exactly it; a queue in every legal state, and a
//! real worker draining keyed jobs, report nothing; a shard that does not
//! answer is reported as such without holding the others.

use crate::common;

use common::TestShards;
use shardq::client::{CheckOptions, CheckReport, Invariant};
use shardq::config::DequeueMode;
use shardq::job::{ClaimedJob, Completion, Outcome};
use shardq::shards::{Shard, ShardSet};
use shardq::store::jobs::{self, Claim, ClaimParams};
use shardq::{Client, Config, HandlerRegistry, JobId, NewJob, Worker};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

struct Setup {
    _shards: TestShards,
    set: ShardSet,
    client: Client,
    config: Config,
}

async fn setup(extra: &str) -> Setup {
    let shards = TestShards::databases(1).await;
    let config = shards.config(extra);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    Setup {
        _shards: shards,
        set,
        client,
        config,
    }
}

impl Setup {
    fn shard(&self) -> &Shard {
        self.set.get(0)
    }

    async fn enqueue(&self, jobs: Vec<NewJob>) -> Vec<JobId> {
        self.client.enqueue_many(jobs).await.unwrap()
    }

    /// One claim of up to `limit` jobs of `queue` by `owner`, 1 h lease.
    async fn claim(&self, queue: &str, owner: &str, limit: u32) -> Vec<ClaimedJob> {
        let params = ClaimParams {
            queue,
            limit,
            owner,
            lease: Duration::from_secs(3600),
            mode: DequeueMode::Gated { slots: 2 },
        };
        match jobs::claim(self.shard(), params).await.unwrap() {
            Claim::Jobs(jobs) => jobs,
            other => panic!("expected jobs, got {other:?}"),
        }
    }

    /// Writes `outcome` for `jobs` as `owner`, retries an hour away.
    async fn finish(&self, owner: &str, jobs: &[ClaimedJob], outcome: Outcome) {
        let done: Vec<Completion> = jobs
            .iter()
            .map(|j| Completion::of(j, outcome.clone()))
            .collect();
        let retry = shardq::config::Backoff {
            min: Duration::from_secs(3600),
            max: Duration::from_secs(3600),
        };
        let write = jobs::CompleteMany {
            owner,
            retry,
            done: &done,
        };
        jobs::complete_many(self.shard(), write).await.unwrap();
    }

    /// Runs `statement` on the shard with `id`'s shard key and id as $1, $2.
    async fn break_job(&self, id: JobId, statement: &str) {
        let changed = self
            .shard()
            .client()
            .await
            .unwrap()
            .execute(statement, &[&id.shard_key, &id.id])
            .await
            .unwrap();
        assert_eq!(changed, 1, "{statement}");
    }

    async fn sql(&self, statement: &str) {
        self.shard()
            .client()
            .await
            .unwrap()
            .batch_execute(statement)
            .await
            .unwrap();
    }

    async fn check(&self) -> CheckReport {
        self.client
            .check(&CheckOptions::from_config(&self.config))
            .await
    }

    async fn status_count(&self, status: &str) -> i64 {
        common::count_on(self.shard(), status).await.unwrap()
    }
}

fn job(queue: &str) -> NewJob {
    NewJob::new(queue, "noop", serde_json::json!({}))
}

fn keyed(queue: &str, key: &str) -> NewJob {
    job(queue).ordering_key(key)
}

/// The report holds exactly `expected` (and nothing else) on its one shard,
/// with `count` instances; returns the examples' job ids and details.
fn only(report: &CheckReport, expected: Invariant, count: u64) -> Vec<(Option<JobId>, String)> {
    assert!(report.unanswered().is_empty(), "{report:#?}");
    assert_eq!(report.broken_invariants(), vec![expected], "{report:#?}");
    assert_eq!(report.broken(expected), count, "{report:#?}");
    assert_eq!(report.violations(), count, "{report:#?}");
    let finding = report.shards[0].finding(expected).unwrap();
    finding
        .examples
        .iter()
        .map(|e| (e.job, e.detail.clone()))
        .collect()
}

/// Unkeyed ready, delayed, running, retrying (scheduled after a failure),
/// succeeded, dead and cancelled jobs; keyed runs (several jobs of one key
/// running under one claim), parked waiting jobs behind a running key and
/// behind a retrying one, a cancellation asked of a running job, a key in
/// two queues. Every invariant holds: the check must say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_in_every_legal_state_breaks_no_invariant() {
    let s = setup("").await;
    let mut batch = vec![
        job("q"),
        job("q"),
        job("q").delay(Duration::from_secs(3600)),
    ];
    for k in 0..4 {
        for _ in 0..3 {
            batch.push(keyed("q", &format!("k{k}")));
            batch.push(keyed("other", &format!("k{k}")));
        }
    }
    s.enqueue(batch).await;
    // Key k0's jobs run as one run of 3; k1 has one running and 2 parked.
    let first = s.claim("q", "worker-a", 4).await;
    let run_of_k0 = first
        .iter()
        .filter(|j| j.ordering_key.as_deref() == Some("k0"))
        .count();
    assert!(run_of_k0 > 1, "a claim takes a key's jobs as one run");
    let other = s.claim("other", "worker-b", 1).await;
    assert_eq!(other.len(), 1);
    // Fail one (retrying, holding its key), succeed one, cancel a running one.
    let more = s.claim("q", "worker-b", 10).await;
    assert!(!more.is_empty());
    s.finish("worker-b", &more[..1], Outcome::Failed("boom".into()))
        .await;
    s.finish(
        "worker-b",
        &more[1..2],
        Outcome::Succeeded(serde_json::json!(1)),
    )
    .await;
    s.client.cancel(first[0].id).await.unwrap();
    // One dead job and one cancelled queued job.
    let doomed = s.enqueue(vec![job("q").max_attempts(1), job("late")]).await;
    s.client.cancel(doomed[1]).await.unwrap();
    let dead = s.claim("q", "worker-c", 100).await;
    let dead: Vec<_> = dead.into_iter().filter(|j| j.id == doomed[0]).collect();
    s.finish("worker-c", &dead, Outcome::Failed("last".into()))
        .await;
    s.enqueue(vec![job("q"), keyed("q", "fresh")]).await;

    for status in [
        "queued",
        "waiting",
        "running",
        "scheduled",
        "succeeded",
        "dead",
        "cancelled",
    ] {
        assert!(s.status_count(status).await > 0, "no {status} job");
    }
    let report = s.check().await;
    assert!(report.unanswered().is_empty(), "{report:#?}");
    assert_eq!(report.violations(), 0, "{report:#?}");
    let findings = &report.shards[0].findings;
    assert_eq!(
        findings.iter().map(|f| f.invariant).collect::<Vec<_>>(),
        Invariant::ALL.to_vec(),
        "every invariant judged"
    );
    let states = report.shards[0].finding(Invariant::JobState).unwrap();
    assert!(states.scanned >= 20, "the rows were read: {states:?}");
}

/// A key whose holder finished without its waiting jobs being queued (the
/// §2.3 promotion race leaves this): stranded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_only_waiting_jobs_is_stranded() {
    let s = setup("").await;
    let ids = s
        .enqueue(vec![keyed("q", "a"), keyed("q", "a"), keyed("q", "b")])
        .await;
    // The claim takes the key's first job and parks the next one.
    let held = s.claim("q", "w", 1).await;
    assert_eq!(held[0].id, ids[0]);
    assert_eq!(s.status_count("waiting").await, 1);
    // The holder ends as the completion would, but nothing queues the next job.
    s.break_job(
        ids[0],
        "UPDATE workflow_status SET status = 'succeeded', owner = NULL, \
         lease_expires_at = NULL, finished_at = now() WHERE shard_key = $1 AND id = $2",
    )
    .await;
    let examples = only(&s.check().await, Invariant::StrandedKey, 1);
    assert_eq!(examples[0].0, Some(ids[1]), "the key's first waiting job");
    assert!(examples[0].1.contains("1 waiting"), "{examples:?}");
}

/// The stranded-key read stops at its bound in the middle of a key: a key
/// cut there shows its running job before its waiting ones, so the cut
/// never makes it look stranded; the report says the read was bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_cut_by_the_read_bound_is_not_taken_for_stranded() {
    let s = setup("").await;
    let ids = s.enqueue((0..4).map(|_| keyed("q", "a")).collect()).await;
    s.claim("q", "w", 1).await;
    s.sql("UPDATE workflow_status SET status = 'waiting' WHERE status = 'queued'")
        .await;
    // The running job gets the highest id: in id order a waiting job comes
    // first, and a read cut after it would take the key for stranded.
    s.break_job(
        ids[0],
        "UPDATE workflow_status SET status = 'waiting', owner = NULL, \
         lease_expires_at = NULL, attempts = 0 WHERE shard_key = $1 AND id = $2",
    )
    .await;
    s.break_job(
        ids[3],
        "UPDATE workflow_status SET status = 'running', owner = 'w', attempts = 1, \
         fence = fence + 1, started_at = now(), lease_expires_at = now() + interval '1 h' \
         WHERE shard_key = $1 AND id = $2",
    )
    .await;
    assert_eq!(s.status_count("waiting").await, 3);
    for bound in 1..=4 {
        let options = CheckOptions {
            key_entries: bound,
            ..CheckOptions::from_config(&s.config)
        };
        let report = s.client.check(&options).await;
        assert_eq!(report.violations(), 0, "bound {bound}: {report:#?}");
        let finding = report.shards[0].finding(Invariant::StrandedKey).unwrap();
        assert_eq!(finding.scanned, u64::from(bound));
        assert_eq!(finding.capped, bound < 5, "bound {bound}");
    }
}

/// A second claim of a key that has a running job: two owners run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claims_running_one_key_are_reported() {
    let s = setup("").await;
    let ids = s.enqueue(vec![keyed("q", "a"), keyed("q", "a")]).await;
    s.claim("q", "w1", 1).await;
    s.break_job(
        ids[1],
        "UPDATE workflow_status SET status = 'running', owner = 'w2', attempts = 1, \
         fence = fence + 1, started_at = now() + interval '1 s', \
         lease_expires_at = now() + interval '1 h' WHERE shard_key = $1 AND id = $2",
    )
    .await;
    let examples = only(&s.check().await, Invariant::KeyRunningTwice, 1);
    assert_eq!(examples[0].0, Some(ids[0]));
    assert!(examples[0].1.contains("w1, w2"), "{examples:?}");
}

/// Leases that expired an hour ago: recovery is not running. One that
/// expired a second ago is within the threshold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_expired_long_ago_are_reported() {
    let s = setup("").await;
    let ids = s.enqueue(vec![job("q"), job("q"), job("q")]).await;
    assert_eq!(s.claim("q", "w", 3).await.len(), 3);
    for (id, ago) in [(ids[0], "1 hour"), (ids[1], "1 second")] {
        s.break_job(
            id,
            &format!(
                "UPDATE workflow_status SET lease_expires_at = now() - interval '{ago}' \
                 WHERE shard_key = $1 AND id = $2"
            ),
        )
        .await;
    }
    let examples = only(&s.check().await, Invariant::LeaseNotRecovered, 1);
    assert_eq!(examples[0].0, Some(ids[0]));
    assert!(examples[0].1.contains("owner w"), "{examples:?}");

    // The threshold is the caller's: at 0.5 s, both are late.
    let options = CheckOptions {
        stale_after: Duration::from_millis(500),
        ..CheckOptions::from_config(&s.config)
    };
    assert_eq!(
        s.client
            .check(&options)
            .await
            .broken(Invariant::LeaseNotRecovered),
        2
    );
}

/// Scheduled jobs due an hour ago: promotion is not running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_jobs_due_long_ago_are_reported() {
    let s = setup("").await;
    let later = Duration::from_secs(3600);
    let ids = s
        .enqueue(vec![
            job("q").delay(later),
            job("q").delay(later),
            job("q").delay(later),
        ])
        .await;
    for (id, ago) in [(ids[0], "1 hour"), (ids[1], "1 second")] {
        s.break_job(
            id,
            &format!(
                "UPDATE workflow_status SET run_at = now() - interval '{ago}' \
                 WHERE shard_key = $1 AND id = $2"
            ),
        )
        .await;
    }
    let examples = only(&s.check().await, Invariant::DueNotPromoted, 1);
    assert_eq!(examples[0].0, Some(ids[0]));
}

/// One row per illegal combination of status, owner, lease, fence,
/// attempts and times; each reported with the rule it breaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_whose_columns_disagree_with_their_status_are_reported() {
    let s = setup("").await;
    let ids = s.enqueue((0..9).map(|_| job("q")).collect()).await;
    let claimed = s.claim("q", "w", 3).await;
    let running: Vec<JobId> = claimed.iter().map(|j| j.id).collect();
    let queued: Vec<JobId> = ids
        .iter()
        .filter(|i| !running.contains(i))
        .copied()
        .collect();
    let broken = [
        (
            running[0],
            "lease_expires_at = NULL",
            "running without a lease",
        ),
        (running[1], "owner = NULL", "running without an owner"),
        (running[2], "fence = 0", "running with fence 0"),
        (queued[0], "owner = 'w'", "queued with an owner"),
        (queued[1], "lease_expires_at = now()", "queued with a lease"),
        (
            queued[2],
            "status = 'succeeded'",
            "succeeded without finished_at",
        ),
        (
            queued[3],
            "status = 'waiting'",
            "waiting without an ordering key",
        ),
        (
            queued[4],
            "status = 'scheduled', cancel_requested = true, run_at = now() + interval '1 h'",
            "scheduled with its cancellation asked",
        ),
        (
            queued[5],
            "attempts = max_attempts",
            "queued with 20 of 20 attempts used",
        ),
    ];
    for (id, set, _) in &broken {
        s.break_job(
            *id,
            &format!("UPDATE workflow_status SET {set} WHERE shard_key = $1 AND id = $2"),
        )
        .await;
    }
    let options = CheckOptions {
        examples: 20,
        ..CheckOptions::from_config(&s.config)
    };
    let report = s.client.check(&options).await;
    let examples = only(&report, Invariant::JobState, broken.len() as u64);
    for (id, _, rule) in &broken {
        let (_, detail) = examples
            .iter()
            .find(|(job, _)| *job == Some(*id))
            .unwrap_or_else(|| panic!("{id} not reported: {examples:?}"));
        assert!(
            detail.contains(rule),
            "{id}: `{detail}` should say `{rule}`"
        );
    }
}

/// A ready job that no claim reaches, numbered below its queue and
/// priority's ready floor (the keyed floor for a keyed job) or not
/// numbered at all (claims start at the floors), is a job-state violation;
/// the jobs beside it are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_job_below_its_ready_floor_is_reported() {
    let s = setup("").await;
    let plain = s.enqueue((0..3).map(|_| job("q")).collect()).await;
    let keyed = s
        .enqueue(
            (0..3)
                .map(|k| job("q").ordering_key(format!("k{k}")))
                .collect(),
        )
        .await;
    let broken = [plain[0], plain[1], keyed[0], keyed[1]];
    // Neither write is a status change, so the numbering trigger stays out.
    for (i, id) in broken.iter().enumerate() {
        let set = match i % 2 {
            0 => "ready_seq = ready_seq - 1000000000",
            _ => "ready_seq = NULL",
        };
        s.break_job(
            *id,
            &format!("UPDATE workflow_status SET {set} WHERE shard_key = $1 AND id = $2"),
        )
        .await;
    }
    let report = s.check().await;
    let examples = only(&report, Invariant::JobState, 4);
    for id in &broken {
        let (_, detail) = examples
            .iter()
            .find(|(job, _)| *job == Some(*id))
            .unwrap_or_else(|| panic!("{id} not reported: {examples:?}"));
        assert!(detail.contains("below its ready floor"), "{id}: {detail}");
    }
}

/// A shard map that disagrees with the list, reported with what to do;
/// the job invariants are still judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_map_that_disagrees_with_the_list_is_reported() {
    let s = setup("").await;
    s.enqueue(vec![job("q")]).await;
    s.sql("UPDATE shardq_shard_map SET shard_count = 3, shard_index = 2")
        .await;
    let report = s.check().await;
    let examples = only(&report, Invariant::ShardMap, 1);
    assert_eq!(examples[0].0, None);
    assert!(
        examples[0].1.contains("shard 2 of 3"),
        "the migrate check's message: {examples:?}"
    );
    assert_eq!(report.shards[0].findings.len(), Invariant::ALL.len());
}

/// A shard that accepts connections and never answers: reported as not
/// answering at the deadline, while the healthy shard's findings arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_shard_is_reported_and_does_not_hold_the_others() {
    let shards = TestShards::databases(1).await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket); // never a byte back
        }
    });
    let toml = format!(
        "{}[[shards]]\nname = \"silent\"\nurl = \"postgres://postgres@127.0.0.1:{port}/x\"\n",
        shards.toml("")
    );
    let config = Config::from_toml(&toml).unwrap();
    let set = ShardSet::connect(&config).unwrap();
    shardq::migrate::migrate_shard(set.get(0), 2).await.unwrap();
    let client = Client::from_shards(set, config.limits.clone());
    let options = CheckOptions {
        deadline: Duration::from_secs(1),
        ..CheckOptions::from_config(&config)
    };
    let started = Instant::now();
    let report = client.check(&options).await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "bounded by the deadline"
    );
    assert_eq!(report.shards[0].error, None, "{report:#?}");
    assert_eq!(report.shards[0].findings.len(), Invariant::ALL.len());
    assert_eq!(report.violations(), 0, "{report:#?}");
    let unanswered = report.unanswered();
    assert_eq!(unanswered.len(), 1);
    assert_eq!(unanswered[0].shard, "silent");
    assert!(
        unanswered[0].error.as_deref().unwrap().contains("deadline"),
        "{report:#?}"
    );
    held.abort();
}

/// A real worker drains keyed runs (several jobs per key, two queues
/// sharing keys) while the check samples the shard: no sample may find a
/// violation, and the samples saw running jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_healthy_drain_never_breaks_an_invariant() {
    const KEYS: usize = 150;
    const PER_KEY: usize = 8;
    let s = setup(
        "[dequeue]\nbatch_size = 50\nempty_backoff_min_ms = 5\nempty_backoff_max_ms = 20\n\
         [worker]\nqueues = [\"a\", \"b\"]\nconcurrency = 8\nbuffer_jobs = 200\n\
         maintenance_interval_ms = 100\n",
    )
    .await;
    let jobs = (0..PER_KEY)
        .flat_map(|_| {
            (0..KEYS).map(|k| {
                let queue = if k % 3 == 0 { "b" } else { "a" };
                NewJob::new(queue, "sleepy", serde_json::json!({})).ordering_key(format!("k{k}"))
            })
        })
        .collect();
    s.enqueue(jobs).await;

    let mut registry = HandlerRegistry::with_builtins();
    registry.register("sleepy", |_ctx| async {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(serde_json::Value::Null)
    });
    let worker = Worker::new(s.config.clone(), s.set.clone(), registry)
        .stop_when_empty(true)
        .run(CancellationToken::new());
    let worker = tokio::spawn(worker);
    let options = CheckOptions::from_config(&s.config);
    let (mut samples, mut saw_running) = (0, false);
    while !worker.is_finished() {
        let report = s.client.check(&options).await;
        assert!(report.unanswered().is_empty(), "{report:#?}");
        assert_eq!(
            report.violations(),
            0,
            "sample {samples} during the drain: {report:#?}"
        );
        samples += 1;
        let running = report.shards[0]
            .finding(Invariant::KeyRunningTwice)
            .unwrap()
            .scanned;
        saw_running |= running > 0;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = worker.await.unwrap();
    assert_eq!(report.stats.succeeded, (KEYS * PER_KEY) as u64);
    assert!(samples >= 3, "only {samples} samples");
    assert!(saw_running, "no sample saw a running job");
    assert_eq!(s.check().await.violations(), 0);
}

/// `shardq check` end to end: 0 while every invariant holds, 3 (with the
/// broken invariant and its job in the report) once one is broken, 4 when
/// nothing is broken but a shard does not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_command_exits_by_what_it_found() {
    let s = setup("").await;
    let ids = s.enqueue(vec![job("q"), job("q")]).await;
    let claimed = s.claim("q", "w", 1).await;
    let queued = *ids.iter().find(|id| **id != claimed[0].id).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, s._shards.toml("")).unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(shardq_harness::exe::shardq())
            .arg("--config")
            .arg(&path)
            .arg("check")
            .args(args)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run shardq")
    };
    let text = |out: &std::process::Output| {
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };

    let out = run(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("all hold"), "{}", text(&out));

    s.break_job(
        queued,
        "UPDATE workflow_status SET owner = 'ghost' WHERE shard_key = $1 AND id = $2",
    )
    .await;
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("job_state"), "{}", text(&out));
    assert!(text(&out).contains(&queued.to_string()), "{}", text(&out));

    let out = run(&["--json"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let finding = report["shards"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["invariant"] == "job_state")
        .unwrap()
        .clone();
    assert_eq!(finding["broken"], 1, "{report}");
    assert_eq!(
        finding["examples"][0]["job"],
        queued.to_string(),
        "{report}"
    );

    // Healthy again, plus a shard that refuses connections: 4.
    s.break_job(
        queued,
        "UPDATE workflow_status SET owner = NULL WHERE shard_key = $1 AND id = $2",
    )
    .await;
    s.sql("UPDATE shardq_shard_map SET shard_count = 2").await;
    std::fs::write(
        &path,
        format!(
            "{}[[shards]]\nname = \"gone\"\nurl = \"postgres://postgres@127.0.0.1:1/x\"\n",
            s._shards.toml("")
        ),
    )
    .unwrap();
    let out = run(&["--shard-timeout-ms", "2000"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("gone: did not answer"),
        "{}",
        text(&out)
    );
}

/// The value of `name` with labels containing every one of `labels`
/// (`k="v"`), from Prometheus text; `None` when no such series.
fn gauge(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|kv| l.contains(kv)))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
}

/// `GET /metrics` over plain TCP, retried while the exporter starts.
async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for _ in 0..200 {
        if let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await {
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
            return response;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nothing answered at http://{addr}/metrics");
}

/// `shardq metrics` exposes one gauge per invariant and shard: 0 while it
/// holds, the count once broken; and whether the shard answered the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exporter_has_a_gauge_per_invariant() {
    let s = setup("").await;
    let ids = s.enqueue(vec![keyed("q", "a"), keyed("q", "a")]).await;
    s.claim("q", "w", 1).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, s._shards.toml("")).unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let _exporter = shardq_harness::exe::shardq_command(&path)
        .args(["metrics", "--listen", &addr.to_string()])
        .spawn()
        .unwrap();
    let name = "shardq_invariant_violations";

    let text = scrape(addr).await;
    assert_eq!(
        gauge(&text, "shardq_invariant_check_up", &["shard=\"s0\""]),
        Some(1.0),
        "{text}"
    );
    for invariant in Invariant::ALL {
        let label = format!("invariant=\"{}\"", invariant.as_str());
        assert_eq!(
            gauge(&text, name, &[&label, "shard=\"s0\""]),
            Some(0.0),
            "{invariant}: {text}"
        );
    }
    // The backlog is still there.
    assert!(text.contains("shardq_queue_jobs{"), "{text}");

    s.break_job(
        ids[0],
        "UPDATE workflow_status SET status = 'succeeded', owner = NULL, \
         lease_expires_at = NULL, finished_at = now() WHERE shard_key = $1 AND id = $2",
    )
    .await;
    let text = scrape(addr).await;
    let stranded = ["invariant=\"stranded_key\"", "shard=\"s0\""];
    assert_eq!(gauge(&text, name, &stranded), Some(1.0), "{text}");
    assert_eq!(
        gauge(&text, name, &["invariant=\"job_state\"", "shard=\"s0\""]),
        Some(0.0),
        "{text}"
    );
}

/// Issue 21 §2.3 as the check sees it: keyed jobs of which some fail and
/// retry, drained by a real worker with promotions every 50 ms. A promotion
/// of a retrying holder between the claim's "is this key busy?" and its
/// parking leaves the holder itself `waiting`: a stranded key, found by the
/// check before the drain stalls. On this branch (without the fix) it
/// failed in 2 of 3 runs, 1-2 keys with all 20 jobs `waiting`, within 5 s.
/// Ignored until that race is fixed (the promotion under the key lock);
/// then it must pass as it stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_with_failing_keyed_jobs_never_strands_a_key() {
    const KEYS: usize = 500;
    const PER_KEY: usize = 20;
    let s = setup(
        "[dequeue]\nbatch_size = 200\nempty_backoff_min_ms = 5\nempty_backoff_max_ms = 20\n\
         [worker]\nqueues = [\"f\"]\nconcurrency = 16\nmaintenance_interval_ms = 50\n\
         retry_backoff_min_ms = 20\nretry_backoff_max_ms = 40\n",
    )
    .await;
    let jobs = (0..PER_KEY)
        .flat_map(|_| {
            (0..KEYS).map(|k| {
                NewJob::new("f", "flaky", serde_json::json!({})).ordering_key(format!("k{k}"))
            })
        })
        .collect();
    s.enqueue(jobs).await;
    let mut registry = HandlerRegistry::with_builtins();
    // One first attempt in five fails; every retry succeeds.
    registry.register("flaky", |ctx| async move {
        if ctx.attempt == 1 && ctx.id.id % 5 == 0 {
            return Err("first attempt fails".into());
        }
        Ok(serde_json::Value::Null)
    });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(s.config.clone(), s.set.clone(), registry)
            .stop_when_empty(true)
            .run(stop.clone()),
    );
    let options = CheckOptions::from_config(&s.config);
    let started = Instant::now();
    let mut first_broken = None;
    while !worker.is_finished() && started.elapsed() < Duration::from_secs(60) {
        let report = s.client.check(&options).await;
        if report.violations() > 0 {
            first_broken = Some(report);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let _ = worker.await;
    assert!(first_broken.is_none(), "{first_broken:#?}");
}

/// The job-state read stays bounded by its windows: on a shard of 2.36
/// million rows the planner, left to itself, read all 40,000 waiting rows
/// by a bitmap scan and sorted them to keep a window's worth (446 ms instead
/// of 72); the check's own settings (`CHECK_SETTINGS`) keep each window an
/// index walk its `LIMIT` stops. At this test's size the planner walks the
/// index either way, so this guards the settings' plan, it does not
/// reproduce the bad one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_state_read_walks_indexes_its_limits_stop() {
    let s = setup("").await;
    s.sql(
        "INSERT INTO workflow_status (shard_key, queue, handler, ordering_key, status) \
         SELECT g % 65536, 'q', 'noop', 'k' || (g % 5000), 'waiting' \
         FROM generate_series(1, 40000) g; \
         INSERT INTO workflow_status (shard_key, queue, handler, ordering_key, status) \
         SELECT g % 65536, 'q', 'noop', 'k' || (g % 5000), 'queued' \
         FROM generate_series(1, 60000) g; \
         INSERT INTO workflow_status (shard_key, queue, handler, status, finished_at) \
         SELECT g % 65536, 'q', 'noop', 'succeeded', now() FROM generate_series(1, 40000) g; \
         ANALYZE workflow_status",
    )
    .await;
    let bounded = {
        let mut db = s.shard().client().await.unwrap();
        let tx = db.transaction().await.unwrap();
        let deadline = "10000".to_string();
        tx.query_typed(
            shardq::store::sql::CHECK_SETTINGS,
            &[(&deadline, tokio_postgres::types::Type::TEXT)],
        )
        .await
        .unwrap();
        let (rows, shown) = (100_i64, 5_i64);
        let explain = format!("EXPLAIN {}", shardq::store::sql::CHECK_JOB_STATE);
        let lines = tx
            .query_typed(
                &explain,
                &[
                    (&rows, tokio_postgres::types::Type::INT8),
                    (&shown, tokio_postgres::types::Type::INT8),
                ],
            )
            .await
            .unwrap();
        lines
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for unbounded in ["Bitmap Heap Scan", "Seq Scan"] {
        assert!(!bounded.contains(unbounded), "{unbounded}:\n{bounded}");
    }
    let report = s.check().await;
    assert_eq!(report.violations(), 0, "{report:#?}");
    let states = report.shards[0].finding(Invariant::JobState).unwrap();
    assert!(
        states.capped,
        "40,000 waiting rows pass the window: {states:?}"
    );
}
