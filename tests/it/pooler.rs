//! shardq through a real PgBouncer 1.18 in `pool_mode = transaction` in front
//! of the shard (`shards[].transaction_pooler = true`): migrate (the
//! transactional migrations; a concurrent index build asks for the server's
//! own URL), enqueue,
//! claim, complete, durable steps with a retry, per-key ordering, dedup,
//! lease recovery and cancellation all pass through it. Before, PgBouncer
//! refused every connection (`unsupported startup parameter: options`), and
//! named prepared statements failed once two server connections were in use.

use crate::common;

use common::pgbouncer::PgBouncer;
use common::{wait_until, TestShards};
use serde_json::json;
use shardq::client::JobOutcome;
use shardq::config::DequeueMode;
use shardq::shards::ShardSet;
use shardq::store::jobs::{self, Claim, ClaimParams};
use shardq::store::upkeep;
use shardq::{Client, Config, HandlerRegistry, NewJob, OnDuplicate, Worker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Few server connections, so that consecutive statements of one client
/// connection land on different server connections.
const POOL: &[(&str, &str)] = &[("default_pool_size", "2")];

struct Through {
    _shards: TestShards,
    _bouncer: PgBouncer,
    config: Config,
    set: ShardSet,
    client: Client,
}

async fn through_pgbouncer(extra: &str) -> Through {
    let shards = TestShards::servers(1).await;
    let bouncer = PgBouncer::start_with(shards.servers[0].server().port, POOL).await;
    let toml = format!(
        "[[shards]]\nname = \"behind-pgbouncer\"\nurl = \"{}\"\npool_size = 8\n\
         transaction_pooler = true\n\n{extra}",
        bouncer.url_for(&shards.urls[0])
    );
    let config = Config::from_toml(&toml).unwrap();
    let set = ShardSet::connect(&config).unwrap();
    // Transactional migrations pass through the pooler; a no-transaction one
    // (concurrent index builds) needs a session, so migrate says to use the
    // server's own URL.
    let err = shardq::migrate::migrate_all(&set)
        .await
        .expect_err("a no-transaction migration refuses the pooler");
    assert!(
        matches!(
            err,
            shardq::migrate::MigrateError::NeedsSession {
                name: "0006_queue_activity.sql",
                ..
            }
        ),
        "{err}"
    );
    let direct = Config::from_toml(&format!(
        "[[shards]]\nname = \"behind-pgbouncer\"\nurl = \"{}\"\n",
        shards.urls[0]
    ))
    .unwrap();
    shardq::migrate::migrate_all(&ShardSet::connect(&direct).unwrap())
        .await
        .expect("migrate on the server itself");
    shardq::migrate::check_all(&set)
        .await
        .expect("check through PgBouncer");
    let client = Client::from_shards(set.clone(), config.limits.clone());
    Through {
        _shards: shards,
        _bouncer: bouncer,
        config,
        set,
        client,
    }
}

/// Succeeded jobs, asked the way a pooler allows (a typed, unnamed statement).
async fn succeeded(set: &ShardSet) -> i64 {
    let db = set.get(0).user_client().await.unwrap();
    db.query_typed_one(
        "SELECT count(*) FROM workflow_status WHERE status = 'succeeded'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

const WORKER: &str = "
[dequeue]
empty_backoff_min_ms = 5
empty_backoff_max_ms = 20
[worker]
queues = [\"q\"]
concurrency = 8
maintenance_interval_ms = 50
retry_backoff_min_ms = 20
retry_backoff_max_ms = 40
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_drains_keyed_unkeyed_and_workflow_jobs_through_pgbouncer() {
    let t = through_pgbouncer(WORKER).await;
    let db = t.set.get(0).user_client().await.unwrap();
    db.batch_execute(
        "CREATE TABLE calls (key text, rev int, started timestamptz, ended timestamptz)",
    )
    .await
    .unwrap();
    let mut registry = HandlerRegistry::with_builtins();
    let set = t.set.clone();
    registry.register("record", move |ctx| {
        let set = set.clone();
        async move {
            let rev = ctx.payload["rev"].as_i64().unwrap() as i32;
            let started = std::time::SystemTime::now();
            tokio::time::sleep(Duration::from_millis(2)).await;
            let db = set.get(0).user_client().await?;
            db.execute(
                "INSERT INTO calls VALUES ($1, $2, $3, clock_timestamp())",
                &[&ctx.ordering_key, &rev, &started],
            )
            .await?;
            Ok(serde_json::Value::Null)
        }
    });
    registry.register("wf", |ctx| async move {
        let a: i64 = ctx.step("a", || async { Ok(40) }).await?;
        let b: i64 = ctx
            .step("b", || async move {
                if ctx.attempt == 1 {
                    Err("transient".into())
                } else {
                    Ok(2)
                }
            })
            .await?;
        Ok(json!({ "sum": a + b }))
    });
    let mut jobs: Vec<NewJob> = (0..4)
        .flat_map(|rev| {
            (0..10).map(move |k| {
                NewJob::new("q", "record", json!({ "rev": rev })).ordering_key(format!("k{k}"))
            })
        })
        .collect();
    jobs.extend((0..200).map(|_| NewJob::new("q", "noop", json!({}))));
    t.client.enqueue_many(jobs).await.unwrap();
    let wf = t
        .client
        .enqueue(NewJob::new("q", "wf", json!({})))
        .await
        .unwrap();
    let first = t
        .client
        .enqueue(NewJob::new("q", "noop", json!({})).dedup("d", OnDuplicate::ReturnExisting))
        .await
        .unwrap();
    let second = t
        .client
        .enqueue(NewJob::new("q", "noop", json!({})).dedup("d", OnDuplicate::ReturnExisting))
        .await
        .unwrap();
    assert_eq!(first, second, "dedup through PgBouncer");

    // Until every job has succeeded (the workflow's retry waits as
    // `scheduled`, which the worker's own "anything left?" check ignores).
    let stop = CancellationToken::new();
    let worker =
        tokio::spawn(Worker::new(t.config.clone(), t.set.clone(), registry).run(stop.clone()));
    wait_until(
        Duration::from_secs(60),
        "every job succeeded through PgBouncer",
        || async { succeeded(&t.set).await == 40 + 200 + 1 + 1 },
    )
    .await;
    stop.cancel();
    let report = worker.await.unwrap();
    assert_eq!(report.stats.succeeded, 40 + 200 + 1 + 1);
    assert_eq!(
        t.client.result(wf, Duration::from_secs(5)).await.unwrap(),
        JobOutcome::Succeeded(json!({ "sum": 42 }))
    );
    // Per key: revisions in order, never overlapping.
    let rows = db
        .query(
            "SELECT key, array_agg(rev ORDER BY started), \
                    bool_and(ended <= next_start OR next_start IS NULL) \
             FROM (SELECT key, rev, started, ended, \
                          lead(started) OVER (PARTITION BY key ORDER BY started) AS next_start \
                   FROM calls) c GROUP BY key",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 10);
    for row in rows {
        let key: String = row.get(0);
        assert_eq!(
            row.get::<_, Vec<i32>>(1),
            vec![0, 1, 2, 3],
            "{key} out of order"
        );
        assert!(row.get::<_, bool>(2), "{key}: calls overlapped");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_recovery_and_cancellation_through_pgbouncer() {
    let t = through_pgbouncer("").await;
    let shard = t.set.get(0);
    let ids = t
        .client
        .enqueue_many(
            (0..3)
                .map(|_| NewJob::new("q", "noop", json!({})).ordering_key("K"))
                .collect(),
        )
        .await
        .unwrap();
    let params = ClaimParams {
        queue: "q",
        limit: 10,
        owner: "gone",
        lease: Duration::from_millis(100),
        mode: DequeueMode::Gated { slots: 2 },
    };
    let Claim::Jobs(run) = jobs::claim(shard, params).await.unwrap() else {
        panic!("nothing claimed through PgBouncer");
    };
    assert_eq!(
        run.iter().map(|j| j.id).collect::<Vec<_>>(),
        ids,
        "the key's run"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let recovered = upkeep::recover_expired(shard, 100).await.unwrap();
    assert_eq!(recovered.requeued, 3);
    assert_eq!(
        t.client.cancel(ids[2]).await.unwrap().map(|s| s.as_str()),
        Some("cancelled")
    );
    let params = ClaimParams {
        owner: "next",
        lease: Duration::from_secs(60),
        ..params
    };
    let Claim::Jobs(again) = jobs::claim(shard, params).await.unwrap() else {
        panic!("recovered jobs not claimable");
    };
    assert_eq!(again.iter().map(|j| j.id).collect::<Vec<_>>(), ids[..2]);
}
