//! What the dashboard tests share: shards on a real PostgreSQL server, a
//! dashboard served on loopback, jobs in every state made by a real worker
//! run, and the counts straight from the tables to check the pages against.
#![allow(dead_code)]

use shardq::shards::ShardSet;
use shardq::{Client, Config, HandlerRegistry, JobId, NewJob, OnDuplicate, Worker};
use shardq_dashboard::DashboardOptions;
use shardq_harness::ShardList;
use shardq_local::{create_database, EphemeralServer};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

static DB_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The worker's settings: retries wait ten minutes (so `retrying` jobs stay
/// retrying), idle shards are asked again quickly.
pub const WORKER: &str = "
[dequeue]
empty_backoff_min_ms = 5
empty_backoff_max_ms = 10
[worker]
queues = [\"dash\"]
maintenance_interval_ms = 50
retry_backoff_min_ms = 600000
retry_backoff_max_ms = 600000
";

/// Shards as databases on one fresh server, migrated.
pub struct Shards {
    pub server: EphemeralServer,
    pub urls: Vec<String>,
    pub config: Config,
    pub set: ShardSet,
    pub client: Client,
}

impl Shards {
    pub async fn start(n: usize) -> Shards {
        let server = EphemeralServer::start().await.expect("start postgres");
        let mut urls = Vec::new();
        for _ in 0..n {
            let name = format!("dash_{}", DB_COUNTER.fetch_add(1, Ordering::Relaxed));
            create_database(&server.admin_url(), &name)
                .await
                .expect("create database");
            let base = server
                .admin_url()
                .rsplit_once('/')
                .expect("a database")
                .0
                .to_string();
            urls.push(format!("{base}/{name}"));
        }
        let config = Config::from_toml(&toml(&urls, WORKER)).expect("valid config");
        let set = ShardSet::connect(&config).expect("pools");
        shardq::migrate::migrate_all(&set).await.expect("migrate");
        let client = Client::from_shards(set.clone(), config.limits.clone());
        Shards {
            server,
            urls,
            config,
            set,
            client,
        }
    }

    /// Counts straight from each shard's table, by queue and list state
    /// (`ready`, `retrying` and `scheduled` split as the dashboard shows
    /// them): `[shard] -> (queue, state) -> count`.
    pub async fn counts(&self) -> Vec<BTreeMap<(String, String), i64>> {
        let mut out = Vec::new();
        for shard in self.set.all() {
            let db = shard.client().await.expect("connection");
            let rows = db
                .query(
                    "SELECT queue, CASE WHEN status = 'queued' THEN 'ready' \
                        WHEN status = 'scheduled' AND attempts > 0 THEN 'retrying' \
                        ELSE status END AS state, count(*) AS n \
                     FROM workflow_status GROUP BY 1, 2",
                    &[],
                )
                .await
                .expect("count");
            out.push(
                rows.iter()
                    .map(|r| ((r.get("queue"), r.get("state")), r.get("n")))
                    .collect(),
            );
        }
        out
    }

    /// The status of one job, straight from its table.
    pub async fn status_of(&self, id: JobId) -> String {
        let shard = self.set.for_key(id.shard_key);
        let db = shard.client().await.expect("connection");
        db.query_one(
            "SELECT status FROM workflow_status WHERE shard_key = $1 AND id = $2",
            &[&id.shard_key, &id.id],
        )
        .await
        .expect("the job")
        .get("status")
    }
}

/// The shard list as TOML (shards `s0`, `s1`, …), then `extra`.
pub fn toml(urls: &[String], extra: &str) -> String {
    ShardList::numbered(urls).pool_size(8).toml(extra)
}

/// A dashboard over `client` on a free loopback port; stops with the token.
pub async fn serve(client: Client, options: DashboardOptions) -> (SocketAddr, CancellationToken) {
    let bound = shardq_dashboard::bind(options).await.expect("bind");
    let addr = bound.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(bound.serve(client, stop.clone()));
    (addr, stop)
}

/// Loopback on a free port, 10 s per shard, defaults otherwise. The tests
/// check counts, not speed: several servers of cold backends share this
/// host, and at the default 2 s a shard's full count can miss its share
/// (the overview then rightly shows it bounded, its delayed jobs as `?`).
/// The tests of a shard that hangs set their own deadline.
pub fn loopback() -> DashboardOptions {
    DashboardOptions {
        shard_deadline: Duration::from_secs(10),
        ..DashboardOptions::new("127.0.0.1:0".parse().unwrap())
    }
}

/// A deduplication id that routes a job to shard `index` of `count`.
pub fn routed_to(index: usize, count: usize, tag: &str) -> String {
    (0..)
        .map(|n| format!("{tag}-{n}"))
        .find(|id| shardq::router::shard_index(shardq::router::shard_key_for(id), count) == index)
        .expect("some id routes there")
}

/// Handlers of the fixture: `ok` succeeds; `flaky` fails while `failing`
/// is set; `hold` runs until `release` gets a permit.
pub struct Handlers {
    pub failing: Arc<AtomicBool>,
    pub release: Arc<Semaphore>,
}

impl Handlers {
    pub fn new() -> Handlers {
        Handlers {
            failing: Arc::new(AtomicBool::new(true)),
            release: Arc::new(Semaphore::new(0)),
        }
    }

    pub fn registry(&self) -> HandlerRegistry {
        let mut registry = HandlerRegistry::with_builtins();
        registry.register("ok", |_| async { Ok(serde_json::json!({"done": true})) });
        let failing = self.failing.clone();
        registry.register("flaky", move |_| {
            let failing = failing.load(Ordering::SeqCst);
            async move {
                if failing {
                    Err("the flaky handler failed on purpose".into())
                } else {
                    Ok(serde_json::json!({"flaky": "fine now"}))
                }
            }
        });
        let release = self.release.clone();
        registry.register("hold", move |_| {
            let release = release.clone();
            async move {
                let _ = release.acquire().await.map(|p| p.forget());
                Ok(serde_json::Value::Null)
            }
        });
        registry
    }
}

/// A worker running in the background until `stop`.
pub fn start_worker(
    shards: &Shards,
    registry: HandlerRegistry,
) -> (tokio::task::JoinHandle<()>, CancellationToken) {
    let stop = CancellationToken::new();
    let worker = Worker::new(shards.config.clone(), shards.set.clone(), registry);
    let handle = tokio::spawn({
        let stop = stop.clone();
        async move {
            worker.run(stop).await;
        }
    });
    (handle, stop)
}

/// What the fixture made, per shard: how many jobs of each kind.
pub struct Fixture {
    /// A dead job on shard 0.
    pub dead_on_0: JobId,
}

/// Jobs in every state on two shards, shard 1 with one more of each kind
/// than shard 0 (so swapped shards show): succeeded, dead, retrying by a
/// worker run; scheduled (delayed an hour), ready (a queue nobody serves),
/// cancelled; and on shard 0 one running job (`hold`) when `hold` is set.
/// Returns once the worker has made them (the worker keeps running).
pub async fn jobs_in_every_state(
    shards: &Shards,
    handlers: &Handlers,
    hold: bool,
) -> (Fixture, tokio::task::JoinHandle<()>, CancellationToken) {
    let count = shards.set.len();
    let mut n = 0;
    let mut job = |queue: &str, handler: &str, shard: usize| {
        n += 1;
        NewJob::new(queue, handler, serde_json::json!({"n": n})).dedup(
            routed_to(shard, count, &format!("j{n}")),
            OnDuplicate::Error,
        )
    };
    let mut dead_on_0 = None;
    let mut cancel = Vec::new();
    for s in 0..count {
        let more = s;
        let mut batch = Vec::new();
        for _ in 0..3 + more {
            batch.push(job("dash", "ok", s));
        }
        for _ in 0..2 + more {
            batch.push(job("dash", "flaky", s).max_attempts(1));
        }
        for _ in 0..1 + more {
            batch.push(job("dash", "flaky", s).max_attempts(5));
        }
        for _ in 0..1 + more {
            batch.push(job("dash", "ok", s).delay(Duration::from_secs(3600)));
        }
        for _ in 0..2 + more {
            batch.push(job("idle", "ok", s));
        }
        let kinds: Vec<_> = batch
            .iter()
            .map(|j| (j.handler.clone(), j.max_attempts))
            .collect();
        let ids = shards.client.enqueue_many(batch).await.expect("enqueue");
        if s == 0 {
            dead_on_0 = kinds
                .iter()
                .zip(&ids)
                .find(|((h, m), _)| h == "flaky" && *m == Some(1))
                .map(|(_, id)| *id);
        }
        cancel.push(
            shards
                .client
                .enqueue(job("idle", "ok", s))
                .await
                .expect("enqueue"),
        );
    }
    for id in cancel {
        shards.client.cancel(id).await.expect("cancel");
    }
    if hold {
        shards
            .client
            .enqueue(job("dash", "hold", 0))
            .await
            .expect("enqueue");
    }
    let (worker, stop) = start_worker(shards, handlers.registry());
    let started = Instant::now();
    loop {
        let counts = shards.counts().await;
        let done = (0..count).all(|s| {
            let c = |state: &str| {
                counts[s]
                    .get(&("dash".into(), state.into()))
                    .copied()
                    .unwrap_or(0)
            };
            let running = if hold && s == 0 { 1 } else { 0 };
            c("succeeded") == 3 + s as i64
                && c("dead") == 2 + s as i64
                && c("retrying") == 1 + s as i64
                && c("running") == running
        });
        if done {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the worker did not make the states in time: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fixture = Fixture {
        dead_on_0: dead_on_0.expect("a dead job on shard 0"),
    };
    (fixture, worker, stop)
}

/// `&amp;` and friends back to text (maud escapes attribute values).
pub fn unescape(html: &str) -> String {
    html.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The value of every `attr="…"` in `html`, in order.
pub fn attrs(html: &str, attr: &str) -> Vec<String> {
    let needle = format!("{attr}=\"");
    html.match_indices(&needle)
        .map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            unescape(&rest[..rest.find('"').unwrap_or(rest.len())])
        })
        .collect()
}
