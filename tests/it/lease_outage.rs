//! A lease outlives a shard outage shorter than two of its extension
//! periods, wherever in the period the outage begins. The worker's leaser
//! extends every third of the lease; a try that fails (the shard refuses
//! connections) must be tried again at its next pass, not a whole period
//! later: two periods after the last extension that worked, the third try
//! lands on the lease's end, and the lease lapses while the job is still
//! running here.
//!
//! The outage is placed by the database's own record: the test reads the
//! job's `lease_expires_at` directly (not through the proxy), and every
//! value tells when its extension ran (`lease_expires_at - lease`). A lapse
//! is an extension that ran after the previous value had passed.

use crate::common;

use chrono::{DateTime, TimeDelta, Utc};
use common::{wait_until, TestShards};
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use shardq_harness::lossy_proxy::{Fault, LossyProxy};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The lease; the leaser extends every third of it (6 s) and passes every
/// second. Periods of several passes leave room for a loaded machine: the
/// outage must still cover two tries that an extension waiting a whole
/// period after a failed one would make, and the retry at the next pass
/// must land well before the lease's end.
const LEASE: TimeDelta = TimeDelta::seconds(18);
const PERIOD: TimeDelta = TimeDelta::seconds(6);

/// The outage starts this long before the next extension is due ...
const BEFORE_DUE: TimeDelta = TimeDelta::milliseconds(300);
/// ... and lasts a little longer than a period, so that the next two tries
/// that wait a period fail: it ends 7.2 s after it began, 5.1 s before the
/// lease would run out (room for passes of one second and their statements
/// slowed by a loaded machine). An extension that waited a whole period
/// after its failed try would land at the lease's end.
const OUTAGE: Duration = Duration::from_millis(7_200);

const WORKER_TOML: &str = "
[worker]
queues = [\"lease-outage\"]
concurrency = 1
lease_ms = 18000
[dequeue]
empty_backoff_min_ms = 5
empty_backoff_max_ms = 50
";

/// The job's lease expiry, read directly (not through the proxy).
async fn lease_of(db: &tokio_postgres::Client) -> Option<DateTime<Utc>> {
    let row = db
        .query_one(
            "SELECT lease_expires_at FROM workflow_status WHERE queue = 'lease-outage'",
            &[],
        )
        .await
        .unwrap();
    row.get::<_, Option<std::time::SystemTime>>(0)
        .map(DateTime::<Utc>::from)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_outlives_a_refusal_shorter_than_two_extension_periods() {
    let shards = TestShards::databases(1).await;
    let direct = shards.config("");
    let set = shards.migrated(&direct).await;
    let url = &shards.urls[0];
    let server = shardq_harness::lossy_proxy::server_addr(url).to_string();
    let proxy = LossyProxy::start(shardq_harness::lossy_proxy::server_addr(url));
    let proxied = url.replace(&server, &proxy.addr().to_string());
    let config = shardq::Config::from_toml(&format!(
        "[[shards]]\nname = \"s0\"\nurl = \"{proxied}\"\npool_size = 12\n{WORKER_TOML}"
    ))
    .unwrap();
    let worker_set = shardq::shards::ShardSet::connect(&config).unwrap();

    // One job whose handler runs until the test lets it go.
    let release = Arc::new(Notify::new());
    let mut registry = HandlerRegistry::new();
    let go = release.clone();
    registry.register("hold", move |_ctx| {
        let go = go.clone();
        async move {
            go.notified().await;
            Ok(serde_json::Value::Null)
        }
    });
    let client = Client::from_shards(set.clone(), direct.limits.clone());
    client
        .enqueue(NewJob::new("lease-outage", "hold", serde_json::json!({})))
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let worker = Worker::new(config, worker_set, registry);
    let running = tokio::spawn(worker.run(shutdown.clone()));

    let db = set.get(0).client().await.unwrap();
    let db = &db;
    wait_until(
        Duration::from_secs(60),
        "the job is claimed",
        move || async move { lease_of(db).await.is_some() },
    )
    .await;
    let claimed = lease_of(db).await.unwrap();
    // The first extension: when it ran places the outage.
    wait_until(
        Duration::from_secs(60),
        "a first extension",
        move || async move { lease_of(db).await.unwrap() > claimed },
    )
    .await;
    let first = lease_of(db).await.unwrap();
    let extended_at = first - LEASE;
    let outage_at = extended_at + PERIOD - BEFORE_DUE;
    let mut leases = vec![claimed, first];
    let wait = (outage_at - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait).await;
    proxy.set_fault(Fault::Refuse);
    tokio::time::sleep(OUTAGE).await;
    proxy.set_fault(Fault::None);
    // Watch the lease until two periods past the outage.
    let watch_until = Utc::now() + PERIOD * 2;
    let mut recovered = None;
    while Utc::now() < watch_until {
        let Some(lease) = lease_of(db).await else {
            // Not running under a lease any more: recovered (its lease lapsed).
            recovered = Some(Utc::now());
            break;
        };
        if leases.last() != Some(&lease) {
            leases.push(lease);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        recovered, None,
        "the running job's lease lapsed and it was recovered; leases seen: {leases:?}"
    );
    release.notify_one();
    wait_until(
        Duration::from_secs(60),
        "the job succeeded",
        move || async move {
            let row = db
                .query_one(
                    "SELECT status FROM workflow_status WHERE queue = 'lease-outage'",
                    &[],
                )
                .await
                .unwrap();
            row.get::<_, String>(0) == "succeeded"
        },
    )
    .await;
    shutdown.cancel();
    running.await.unwrap();

    let lapses: Vec<String> = leases
        .windows(2)
        .filter(|w| w[1] - LEASE > w[0])
        .map(|w| {
            format!(
                "lease ran out at {} and was extended only at {} ({} ms late)",
                w[0],
                w[1] - LEASE,
                (w[1] - LEASE - w[0]).num_milliseconds()
            )
        })
        .collect();
    assert!(
        leases.len() > 2,
        "the lease was extended after the outage: {leases:?}"
    );
    assert!(lapses.is_empty(), "the lease lapsed: {lapses:?}");
    let attempts: i32 = db
        .query_one(
            "SELECT attempts FROM workflow_status WHERE queue = 'lease-outage'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempts, 1, "the job ran once, its lease never lost");
}
