//! A give-up written by the leaser (the jobs a lost claim reply left this
//! process owning) is counted once, the same in every reader: the report's
//! totals, the per-shard counters the heartbeat publishes, and the
//! Prometheus text. Against a real server.

use super::leaser::{self, LeaserConfig};
use super::running::{LostClaims, RunningJobs};
use super::shard_health::ShardHealth;
use super::worker_run::WorkerRun;
use super::WorkerReport;
use crate::config::{Backoff, Config};
use crate::job::NewJob;
use crate::prometheus::WorkerMetrics;
use crate::shards::ShardSet;
use crate::store::jobs::{self, Claim, ClaimParams};
use crate::telemetry::Stats;
use shardq_local::EphemeralServer;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The leaser's statement deadline here: orphans are jobs claimed more than
/// two of these ago, looked for during five after the lost reply (the
/// leaser's first look comes a second after it starts).
const DEADLINE: Duration = Duration::from_secs(1);

/// Generous: the leaser looks once a second, on a loaded CI machine.
const PATIENCE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_lease_side_give_up_is_counted_once_in_the_report_the_shard_counters_and_prometheus() {
    let server = EphemeralServer::start().await.expect("server");
    let toml = format!(
        "[[shards]]\nname = \"s0\"\nurl = \"{}\"\npool_size = 4\n\n[worker]\nqueues = [\"q\"]\n",
        server.url()
    );
    let config = Config::from_toml(&toml).expect("config");
    let shards = ShardSet::connect(&config).expect("connect");
    crate::migrate::migrate_all(&shards).await.expect("migrate");
    let client = crate::client::Client::from_shards(shards.clone(), config.limits.clone());
    client
        .enqueue(NewJob::new("q", "noop", serde_json::json!({})))
        .await
        .expect("enqueue");

    // A claim whose reply this process never acted on: the row is running
    // and owned by us, but no role holds it.
    let owner: Arc<str> = "lease-telemetry-test".into();
    let claim = ClaimParams {
        queue: "q",
        limit: 1,
        owner: &owner,
        lease: Duration::from_secs(60),
        mode: config.dequeue.mode,
    };
    let claimed = jobs::claim(shards.get(0), claim).await.expect("claim");
    assert!(
        matches!(claimed, Claim::Jobs(ref j) if j.len() == 1),
        "{claimed:?}"
    );
    tokio::time::sleep(DEADLINE * 3).await;

    let stats = Arc::new(Stats::for_queues(1, vec!["q".into()]));
    let run = Arc::new(WorkerRun {
        lost_claims: LostClaims::new(1),
        shards: shards.clone(),
        owner,
        stats: stats.clone(),
        running: RunningJobs::default(),
        health: ShardHealth::new(1, Duration::from_millis(250)),
        permits: Arc::new(super::permits::Permits::new(&[], 0)),
    });
    run.lost_claims.lost(0);
    let leaser_config = LeaserConfig {
        lease: Duration::from_secs(60),
        statement_timeout: DEADLINE,
        retry: Backoff {
            min: Duration::from_millis(10),
            max: Duration::from_millis(10),
        },
    };
    let stop = CancellationToken::new();
    let leasing = tokio::spawn(leaser::run(leaser_config, run.clone(), stop.clone()));
    let started = Instant::now();
    while stats.snapshot().released == 0 {
        assert!(started.elapsed() < PATIENCE, "the leaser gave nothing back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    leasing.await.expect("leaser");

    let report = WorkerReport {
        stats: stats.snapshot(),
        elapsed: started.elapsed(),
    };
    assert_eq!(report.stats.released, 1, "{report:?}");
    assert_eq!(report.stats.completion_statements, 1, "{report:?}");
    let per_shard = stats.shards();
    // A job given back unstarted is still to run: the shard's completed
    // agrees with the report's finished attempts, which leave it out.
    assert_eq!(
        per_shard[0].completed,
        report.stats.finished(),
        "the shard's counters disagree with the report: {per_shard:?} vs {report:?}"
    );
    let text = WorkerMetrics::new(stats.clone(), vec!["s0".into()]).encode();
    assert!(
        text.contains("shardq_worker_outcomes_total{shard=\"s0\",outcome=\"released\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("shardq_worker_completion_statements_total{shard=\"s0\"} 1\n"),
        "{text}"
    );
}
