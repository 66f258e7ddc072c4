//! Enqueue from SQL (`shardq_route`, `shardq_enqueue`, `shardq_enqueue_many`,
//! migrations/functions/): the routing vectors on a real shard, jobs written
//! through tokio-postgres and through `psql` run once on a Rust worker, the
//! batch form, a wrong shard refused with SQLSTATE SQ001 and nothing
//! written, deduplication shared with the Rust client, invalid input refused
//! with what to fix, the caller's own transaction, PgBouncer in transaction
//! mode, and the least-privilege producer role.

use crate::common;

use common::pgbouncer::PgBouncer;
use common::{count_status, TestShards};
use serde_json::{json, Value};
use shardq::job::{MAX_ATTEMPTS, MAX_ORDERING_KEY_BYTES, MAX_QUEUE_BYTES};
use shardq::shards::ShardSet;
use shardq::{router, Client, Config, HandlerRegistry, JobId, NewJob, OnDuplicate, Worker};
use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

/// The psql of the PostgreSQL the tests run.
const PSQL: &str = "/usr/lib/postgresql/15/bin/psql";
/// How long a worker may take to drain a few dozen jobs on a loaded 2-core machine.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);
/// How long a notification may take to arrive after its commit.
const NOTIFY_LIMIT: Duration = Duration::from_secs(30);
/// Wrong shard (docs/enqueue-from-sql.md).
const WRONG_SHARD: &str = "SQ001";
/// Invalid input: invalid_parameter_value.
const INVALID: &str = "22023";

/// Quick polling, so that `stop_when_empty` notices the end soon.
const FAST: &str = "
[dequeue]
empty_backoff_min_ms = 5
empty_backoff_max_ms = 20
[worker]
completion_flush_ms = 2
";

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

/// `shardq_enqueue` with its eight arguments, positionally.
const ENQUEUE: &str = "SELECT job_id, shard_key, id, is_new \
    FROM shardq_enqueue($1, $2, $3, $4, $5, $6, $7, $8)";

/// One job's arguments for [`ENQUEUE`].
#[derive(Clone)]
struct Args {
    queue: String,
    handler: String,
    payload: Value,
    ordering_key: Option<String>,
    dedup_id: Option<String>,
    priority: i32,
    max_attempts: Option<i32>,
}

fn job(payload: Value) -> Args {
    Args {
        queue: "default".into(),
        handler: "record".into(),
        payload,
        ordering_key: None,
        dedup_id: None,
        priority: 0,
        max_attempts: None,
    }
}

impl Args {
    fn key(mut self, key: &str) -> Args {
        self.ordering_key = Some(key.into());
        self
    }
    fn dedup(mut self, id: &str) -> Args {
        self.dedup_id = Some(id.into());
        self
    }
}

/// A job written by `shardq_enqueue`: its id and whether the call wrote it.
#[derive(Debug, Clone, PartialEq)]
struct Enqueued {
    id: JobId,
    is_new: bool,
}

/// Calls `shardq_enqueue` on `db` with unnamed statements (as node-postgres
/// does; they work through a transaction pooler).
async fn enqueue<C: tokio_postgres::GenericClient>(
    db: &C,
    a: &Args,
) -> Result<Enqueued, tokio_postgres::Error> {
    let run_at: Option<std::time::SystemTime> = None;
    let params: [(&(dyn ToSql + Sync), Type); 8] = [
        (&a.queue, Type::TEXT),
        (&a.handler, Type::TEXT),
        (&a.payload, Type::JSONB),
        (&a.ordering_key, Type::TEXT),
        (&a.dedup_id, Type::TEXT),
        (&run_at, Type::TIMESTAMPTZ),
        (&a.priority, Type::INT4),
        (&a.max_attempts, Type::INT4),
    ];
    let row = db.query_typed(ENQUEUE, &params).await?.remove(0);
    let job_id: String = row.get("job_id");
    let id = JobId {
        shard_key: row.get("shard_key"),
        id: row.get("id"),
    };
    assert_eq!(job_id, id.to_string(), "job_id is shard_key-id");
    Ok(Enqueued {
        id,
        is_new: row.get("is_new"),
    })
}

/// Calls `shardq_enqueue_many` with `jobs` (a JSON array); returns the ids in
/// input order.
async fn enqueue_many<C: tokio_postgres::GenericClient>(
    db: &C,
    jobs: &Value,
) -> Result<Vec<Enqueued>, tokio_postgres::Error> {
    let rows = db
        .query_typed(
            "SELECT job_index, shard_key, id, is_new FROM shardq_enqueue_many($1)",
            &[(jobs, Type::JSONB)],
        )
        .await?;
    Ok(rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            assert_eq!(row.get::<_, i32>("job_index") as usize, i, "input order");
            Enqueued {
                id: JobId {
                    shard_key: row.get("shard_key"),
                    id: row.get("id"),
                },
                is_new: row.get("is_new"),
            }
        })
        .collect())
}

/// The SQLSTATE and the whole text (message, detail, hint) of a refusal.
fn refusal(err: tokio_postgres::Error) -> (String, String) {
    let db = err.as_db_error().expect("a server error");
    let text = format!(
        "{} | {} | {}",
        db.message(),
        db.detail().unwrap_or(""),
        db.hint().unwrap_or("")
    );
    (db.code().code().to_string(), text)
}

/// Runs `psql -c sql` on `url`; returns (success, stdout, stderr).
fn psql(url: &str, sql: &str) -> (bool, String, String) {
    let out = Command::new(PSQL)
        .args([
            "-X",
            "-q",
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "VERBOSITY=verbose",
        ])
        .arg("-d")
        .arg(url)
        .arg("-c")
        .arg(sql)
        .output()
        .expect("run psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The index of the shard (of `n`) that `key` routes to, by the Rust router.
fn shard_of(key: &str, n: usize) -> usize {
    router::shard_index(router::shard_key_for(key), n)
}

/// A key that routes to shard `index` of `n`.
fn key_on(prefix: &str, index: usize, n: usize) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| shard_of(k, n) == index)
        .expect("some key routes there")
}

/// Every job row on every shard.
async fn count_all(shards: &ShardSet) -> i64 {
    let mut total = 0;
    for shard in shards.all() {
        let db = shard.client().await.unwrap();
        total += db
            .query_one("SELECT count(*) FROM workflow_status", &[])
            .await
            .unwrap()
            .get::<_, i64>(0);
    }
    total
}

/// A registry whose `record` handler counts its calls by the payload's `tag`
/// and records each key's `seq` in call order.
#[derive(Clone, Default)]
struct Calls {
    by_tag: Arc<Mutex<HashMap<String, u32>>>,
    seq_by_key: Arc<Mutex<HashMap<String, Vec<i64>>>>,
}

impl Calls {
    fn registry(&self) -> HandlerRegistry {
        let mut registry = HandlerRegistry::with_builtins();
        let calls = self.clone();
        registry.register("record", move |ctx| {
            let calls = calls.clone();
            async move {
                let tag = ctx.payload["tag"].as_str().unwrap_or("").to_string();
                *calls.by_tag.lock().unwrap().entry(tag).or_default() += 1;
                if let (Some(key), Some(seq)) = (&ctx.ordering_key, ctx.payload["seq"].as_i64()) {
                    let mut seqs = calls.seq_by_key.lock().unwrap();
                    seqs.entry(key.clone()).or_default().push(seq);
                }
                Ok(Value::Null)
            }
        });
        registry
    }

    async fn drain(&self, config: &Config, shards: &ShardSet) -> shardq::WorkerReport {
        let worker =
            Worker::new(config.clone(), shards.clone(), self.registry()).stop_when_empty(true);
        tokio::time::timeout(DRAIN_LIMIT, worker.run(CancellationToken::new()))
            .await
            .expect("the worker drains the queue in time")
    }
}

/// `shardq_route` on a real shard gives every vector's shard key, and its
/// index for lists of 1..=8 shards (the map rewritten by hand to each count:
/// a test shard, never done on a real one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shardq_route_matches_the_routing_vectors_file() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    shards.migrated(&config).await;
    let db = connect(&shards.urls[0]).await;
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/routing-vectors.json"
    ))
    .unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let vectors = doc["vectors"].as_array().unwrap();
    let keys: Vec<&str> = vectors.iter().map(|v| v["key"].as_str().unwrap()).collect();
    for n in 1..=8i32 {
        // This shard as shard 0 of n, with epoch 1 of that list's map.
        db.execute(
            "UPDATE shardq_shard_map SET shard_count = $1, shard_index = 0",
            &[&n],
        )
        .await
        .unwrap();
        db.batch_execute("DELETE FROM shardq_map_ranges; DELETE FROM shardq_map_epochs")
            .await
            .unwrap();
        db.execute(shardq::store::sql::MAP_EPOCH_ONE_RECORD, &[])
            .await
            .unwrap();
        // Many keys in one round trip, as docs/enqueue-from-sql.md shows.
        let rows = db
            .query(
                "SELECT r.* FROM unnest($1::text[]) WITH ORDINALITY AS u(k, o), \
                 shardq_route(u.k) r ORDER BY u.o",
                &[&keys],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), vectors.len());
        for (v, row) in vectors.iter().zip(&rows) {
            let key = v["key"].as_str().unwrap();
            assert_eq!(v["shard_key"], row.get::<_, i32>("shard_key"), "{key:?}");
            assert_eq!(
                v["shard_index_by_count"][(n - 1) as usize],
                row.get::<_, i32>("shard_index"),
                "{key:?} among {n} shards"
            );
            assert_eq!(row.get::<_, i32>("shard_count"), n);
            assert_eq!(row.get::<_, i32>("epoch"), 1);
        }
        // No key: a random shard key, with its index.
        let row = db
            .query_one("SELECT * FROM shardq_route(NULL)", &[])
            .await
            .unwrap();
        let k: i32 = row.get("shard_key");
        assert!((0..65536).contains(&k));
        assert_eq!(
            row.get::<_, i32>("shard_index") as usize,
            router::shard_index(k, n as usize)
        );
    }
}

/// Jobs written from SQL, through tokio-postgres and through `psql`, each
/// on the shard `shardq_route` names, run exactly once on a Rust worker; a
/// key's jobs from one batch run in input order; unkeyed jobs get shard
/// keys of the shard they were written on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_enqueued_from_sql_run_once_on_a_rust_worker() {
    let shards = TestShards::databases(2).await;
    let config = shards.config(FAST);
    let set = shards.migrated(&config).await;
    let dbs = [
        connect(&shards.urls[0]).await,
        connect(&shards.urls[1]).await,
    ];
    let mut tags = Vec::new();
    let mut ids = Vec::new();
    // tokio-postgres: route on shard 0, enqueue where it says.
    for i in 0..12 {
        let key = format!("tp-{i}");
        let route = dbs[0]
            .query_one("SELECT shard_index FROM shardq_route($1)", &[&key])
            .await
            .unwrap();
        let index: i32 = route.get(0);
        assert_eq!(index as usize, shard_of(&key, 2));
        let tag = format!("tp-{i}");
        let written = enqueue(&dbs[index as usize], &job(json!({ "tag": tag })).key(&key))
            .await
            .unwrap();
        assert!(written.is_new);
        assert_eq!(written.id.shard_key, router::shard_key_for(&key));
        tags.push(tag);
        ids.push(written.id);
    }
    // Unkeyed, on each shard: its shard keys are that shard's.
    for (index, db) in dbs.iter().enumerate() {
        for i in 0..5 {
            let tag = format!("free-{index}-{i}");
            let written = enqueue(db, &job(json!({ "tag": tag }))).await.unwrap();
            assert_eq!(router::shard_index(written.id.shard_key, 2), index);
            tags.push(tag);
            ids.push(written.id);
        }
    }
    // One key's run through the batch form, on its shard.
    let key = "batch-key";
    let jobs: Vec<Value> = (0..6)
        .map(|seq| {
            json!({"queue": "default", "handler": "record", "ordering_key": key,
                   "payload": {"tag": format!("batch-{seq}"), "seq": seq}})
        })
        .collect();
    let written = enqueue_many(&dbs[shard_of(key, 2)], &Value::Array(jobs))
        .await
        .unwrap();
    assert!(
        written.windows(2).all(|w| w[0].id.id < w[1].id.id),
        "ascending ids in input order: {written:?}"
    );
    tags.extend((0..6).map(|seq| format!("batch-{seq}")));
    ids.extend(written.iter().map(|w| w.id));
    // psql: route, then enqueue on the shard named.
    for i in 0..4 {
        let key = format!("psql-{i}");
        let (ok, index, err) = psql(
            &shards.urls[0],
            &format!("SELECT shard_index FROM shardq_route('{key}')"),
        );
        assert!(ok, "{err}");
        let index: usize = index.parse().unwrap();
        assert_eq!(index, shard_of(&key, 2));
        let (ok, job_id, err) = psql(
            &shards.urls[index],
            &format!(
                "SELECT job_id FROM shardq_enqueue('default', 'record', \
                 '{{\"tag\": \"{key}\"}}', '{key}')"
            ),
        );
        assert!(ok, "{err}");
        tags.push(key);
        ids.push(job_id.parse().expect("psql prints the job id"));
    }

    let calls = Calls::default();
    let report = calls.drain(&config, &set).await;
    assert_eq!(report.stats.succeeded as usize, tags.len());
    let by_tag = calls.by_tag.lock().unwrap().clone();
    for tag in &tags {
        assert_eq!(by_tag.get(tag), Some(&1), "{tag} ran exactly once");
    }
    assert_eq!(by_tag.len(), tags.len(), "nothing else ran: {by_tag:?}");
    let seqs = calls.seq_by_key.lock().unwrap()[key].clone();
    assert_eq!(
        seqs,
        (0..6).collect::<Vec<i64>>(),
        "the key's jobs in order"
    );
    // Each returned id is the job that ran (the Rust client reads it).
    let client = Client::from_shards(set.clone(), config.limits.clone());
    for id in ids {
        let info = client.job(id).await.unwrap().expect("the job is there");
        assert_eq!(info.status.as_str(), "succeeded", "{id}");
    }
    assert_eq!(count_status(&set, "succeeded").await as usize, tags.len());
}

/// A wrong shard refuses with SQLSTATE SQ001 naming the right shard, writes
/// nothing (single, deduplicated, batch, psql), and the same call on the
/// right shard then writes the job once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_shard_refuses_with_sq001_and_writes_nothing() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let dbs = [
        connect(&shards.urls[0]).await,
        connect(&shards.urls[1]).await,
    ];
    let key = key_on("w", 1, 2);
    let keyed = job(json!({})).key(&key);

    let (code, text) = refusal(enqueue(&dbs[0], &keyed).await.unwrap_err());
    assert_eq!(code, WRONG_SHARD, "{text}");
    assert!(text.contains("on shard 1 of 2"), "{text}");
    assert!(text.contains("not on this shard (0)"), "{text}");
    assert!(text.contains("shard_index=1"), "{text}");
    assert!(text.contains("enqueue it on shard 1"), "{text}");

    let dedup = job(json!({})).dedup(&key_on("d", 1, 2));
    let (code, text) = refusal(enqueue(&dbs[0], &dedup).await.unwrap_err());
    assert_eq!(code, WRONG_SHARD, "{text}");
    assert!(text.contains("deduplication id routes"), "{text}");

    let batch = json!([
        {"queue": "default", "handler": "record"},
        {"queue": "default", "handler": "record", "ordering_key": key},
    ]);
    let (code, text) = refusal(enqueue_many(&dbs[0], &batch).await.unwrap_err());
    assert_eq!(code, WRONG_SHARD, "{text}");
    assert!(text.starts_with("job 1: "), "{text}");

    let (ok, _, err) = psql(
        &shards.urls[0],
        &format!("SELECT shardq_enqueue('default', 'record', '{{}}', '{key}')"),
    );
    assert!(!ok);
    assert!(err.contains("SQ001"), "psql shows the SQLSTATE: {err}");
    assert_eq!(count_all(&set).await, 0, "a refused call writes nothing");

    // The retry where the refusal said: written once.
    let written = enqueue(&dbs[1], &keyed).await.unwrap();
    assert!(written.is_new);
    let written = enqueue(&dbs[1], &dedup).await.unwrap();
    assert!(written.is_new);
    assert_eq!(count_all(&set).await, 2);
    let on_1: i64 = dbs[1]
        .query_one("SELECT count(*) FROM workflow_status", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(on_1, 2);
}

/// The batch form: input order, ascending ids, a future run_at scheduled,
/// a deduplication id; one refused job (its index named) writes none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_form_writes_all_in_order_or_nothing() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let db = connect(&shards.urls[0]).await;
    let jobs = json!([
        {"queue": "default", "handler": "record", "payload": {"n": 0}},
        {"queue": "default", "handler": "record", "ordering_key": "k", "priority": 5},
        {"queue": "default", "handler": "record", "run_at": "2099-01-01T00:00:00Z"},
        {"queue": "default", "handler": "record", "dedup_id": "once", "max_attempts": 3},
        {"queue": "default", "handler": "record", "dedup_id": "once"},
    ]);
    let written = enqueue_many(&db, &jobs).await.unwrap();
    assert_eq!(written.len(), 5);
    assert!(written[..4].windows(2).all(|w| w[0].id.id < w[1].id.id));
    assert_eq!(
        written.iter().map(|w| w.is_new).collect::<Vec<_>>(),
        [true, true, true, true, false]
    );
    assert_eq!(
        written[4].id, written[3].id,
        "the duplicate gets the holder's id"
    );
    let rows = db
        .query(
            "SELECT status, priority, max_attempts FROM workflow_status ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, i32, i32)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        got,
        [
            ("queued".to_string(), 0, 20),
            ("queued".to_string(), 5, 20),
            ("scheduled".to_string(), 0, 20),
            ("queued".to_string(), 0, 3),
        ]
    );

    let bad = json!([
        {"queue": "default", "handler": "record"},
        {"queue": "default", "handler": "record"},
        {"queue": "default", "handler": "record", "max_attempts": 0},
    ]);
    let (code, text) = refusal(enqueue_many(&db, &bad).await.unwrap_err());
    assert_eq!(code, INVALID, "{text}");
    assert!(text.starts_with("job 2: max_attempts is 0"), "{text}");
    let typo = json!([{"queue": "default", "handler": "record", "delay_ms": 5}]);
    let (code, text) = refusal(enqueue_many(&db, &typo).await.unwrap_err());
    assert_eq!(code, INVALID, "{text}");
    assert!(text.contains("job 0: unknown field `delay_ms`"), "{text}");
    let (code, text) = refusal(enqueue_many(&db, &json!({"queue": "q"})).await.unwrap_err());
    assert_eq!(code, INVALID, "{text}");
    assert!(text.contains("a jsonb array of jobs, not object"), "{text}");
    assert_eq!(
        count_all(&set).await,
        4,
        "the refused batches wrote nothing"
    );
}

/// The same deduplication id twice gives one job; the Rust client sees the
/// same holder (one rule on both paths).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deduplication_id_twice_gives_one_job() {
    let shards = TestShards::databases(2).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let dedup_id = "invoice-7";
    let index = shard_of(dedup_id, 2);
    let db = connect(&shards.urls[index]).await;
    let once = job(json!({"n": 1})).dedup(dedup_id);
    let first = enqueue(&db, &once).await.unwrap();
    let second = enqueue(&db, &once).await.unwrap();
    assert!(first.is_new);
    assert_eq!(
        second,
        Enqueued {
            id: first.id,
            is_new: false
        }
    );
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let from_rust = client
        .enqueue(
            NewJob::new("default", "record", json!({}))
                .dedup(dedup_id, OnDuplicate::ReturnExisting),
        )
        .await
        .unwrap();
    assert_eq!(from_rust, first.id, "the Rust client finds the SQL job");
    assert_eq!(count_all(&set).await, 1);
    // Another queue is another id space.
    let other = Args {
        queue: "other".into(),
        ..once.clone()
    };
    assert!(enqueue(&db, &other).await.unwrap().is_new);
    assert_eq!(count_all(&set).await, 2);
}

/// Invalid input is refused (SQLSTATE 22023) with a message saying what to
/// change; the limits are the Rust client's, each accepted at its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_input_is_refused_with_what_to_fix() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let db = connect(&shards.urls[0]).await;
    let base = job(json!({}));
    let refused = [
        (
            Args {
                queue: "q".repeat(MAX_QUEUE_BYTES + 1),
                ..base.clone()
            },
            "queue is 256 bytes, over the limit of 255 bytes; shorten it",
        ),
        (
            Args {
                queue: String::new(),
                ..base.clone()
            },
            "queue name is empty",
        ),
        (
            Args {
                handler: "é".repeat(128),
                ..base.clone()
            },
            "handler is 256 bytes, over the limit of 255 bytes",
        ),
        (
            base.clone().key(&"k".repeat(MAX_ORDERING_KEY_BYTES + 1)),
            "ordering key is 1025 bytes, over the limit of 1024 bytes",
        ),
        (
            Args {
                max_attempts: Some(0),
                ..base.clone()
            },
            "max_attempts is 0; it must be at least 1 and at most 1000",
        ),
        (
            Args {
                max_attempts: Some(MAX_ATTEMPTS + 1),
                ..base.clone()
            },
            "max_attempts is 1001; it must be at least 1 and at most 1000",
        ),
        (
            base.clone().key("k").dedup("d"),
            "cannot have both an ordering key and a deduplication id",
        ),
    ];
    for (args, says) in &refused {
        let (code, text) = refusal(enqueue(&db, args).await.unwrap_err());
        assert_eq!(code, INVALID, "{text}");
        assert!(text.contains(says), "expected `{says}` in: {text}");
    }
    assert_eq!(count_all(&set).await, 0);
    // At the bounds: accepted.
    for args in [
        Args {
            queue: "q".repeat(MAX_QUEUE_BYTES),
            ..base.clone()
        },
        base.clone().key(&"k".repeat(MAX_ORDERING_KEY_BYTES)),
        Args {
            max_attempts: Some(MAX_ATTEMPTS),
            ..base.clone()
        },
        Args {
            max_attempts: Some(1),
            ..base.clone()
        },
    ] {
        enqueue(&db, &args).await.expect("at the bound");
    }
    // The payload limit: limits.max_payload_bytes by default, a database
    // setting to match another shards.toml (seen by new connections).
    db.batch_execute(&format!(
        "ALTER DATABASE {} SET shardq.max_payload_bytes = 100",
        shards.urls[0].rsplit('/').next().unwrap()
    ))
    .await
    .unwrap();
    let db = connect(&shards.urls[0]).await;
    let big = job(json!({ "data": "x".repeat(200) }));
    let (code, text) = refusal(enqueue(&db, &big).await.unwrap_err());
    assert_eq!(code, INVALID, "{text}");
    assert!(
        text.contains("over limits.max_payload_bytes = 100"),
        "{text}"
    );
    assert!(
        text.contains("shardq.max_payload_bytes"),
        "the hint: {text}"
    );
    enqueue(&db, &job(json!({ "data": "small" })))
        .await
        .unwrap();
    assert_eq!(count_all(&set).await, 5);
}

/// Inside the caller's transaction: a rollback leaves no job and sends no
/// wake-up; a commit keeps the job with the caller's own row and wakes
/// listeners on `shardq_ready` with the queue's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_the_callers_transaction_a_rollback_leaves_no_job() {
    use futures_util::StreamExt;
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let (listener, mut connection) = tokio_postgres::connect(&shards.urls[0], NoTls)
        .await
        .unwrap();
    let (tx_notes, mut notes) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx_notes.send(n.payload().to_string());
            }
        }
    });
    listener.batch_execute("LISTEN shardq_ready").await.unwrap();

    let mut db = connect(&shards.urls[0]).await;
    db.batch_execute("CREATE TABLE orders (n int)")
        .await
        .unwrap();
    let tx = db.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES (1)", &[])
        .await
        .unwrap();
    enqueue(
        &tx,
        &Args {
            queue: "rolled".into(),
            ..job(json!({}))
        },
    )
    .await
    .unwrap();
    enqueue_many(&tx, &json!([{"queue": "rolled", "handler": "record"}]))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(count_all(&set).await, 0, "rolled back: no job");

    let tx = db.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES (2)", &[])
        .await
        .unwrap();
    let written = enqueue(
        &tx,
        &Args {
            queue: "kept".into(),
            ..job(json!({}))
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let note = tokio::time::timeout(NOTIFY_LIMIT, notes.recv())
        .await
        .expect("a wake-up after the commit")
        .unwrap();
    assert_eq!(
        note, "kept",
        "the committed job's queue, not the rolled-back one"
    );
    assert_eq!(count_all(&set).await, 1);
    let orders: i64 = db
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(orders, 1);
    let client = Client::from_shards(set.clone(), config.limits.clone());
    assert!(client.job(written.id).await.unwrap().is_some());
}

/// Through PgBouncer in transaction mode (two server connections, so a
/// client's statements change server connection): single and batch calls,
/// one inside a transaction, and psql; a worker on the server drains them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_in_transaction_mode() {
    let shards = TestShards::servers(1).await;
    let bouncer = PgBouncer::start_with(
        shards.servers[0].server().port,
        &[("default_pool_size", "2")],
    )
    .await;
    let config = shards.config(FAST);
    let set = shards.migrated(&config).await;
    let url = bouncer.url_for(&shards.urls[0]);
    let mut conns = Vec::new();
    for _ in 0..3 {
        conns.push(connect(&url).await);
    }
    let mut tags = Vec::new();
    for (c, db) in conns.iter().enumerate() {
        for i in 0..4 {
            let tag = format!("pb-{c}-{i}");
            let mut args = job(json!({ "tag": tag }));
            if i % 2 == 0 {
                args = args.key(&format!("key-{c}"));
            }
            enqueue(db, &args).await.unwrap();
            tags.push(tag);
        }
        let batch: Vec<Value> = (0..3)
            .map(|i| {
                json!({"queue": "default", "handler": "record",
                            "payload": {"tag": format!("pbb-{c}-{i}")}})
            })
            .collect();
        tags.extend((0..3).map(|i| format!("pbb-{c}-{i}")));
        enqueue_many(db, &Value::Array(batch)).await.unwrap();
    }
    let mut db = connect(&url).await;
    let tx = db.transaction().await.unwrap();
    enqueue(&tx, &job(json!({ "tag": "pb-tx" }))).await.unwrap();
    tx.commit().await.unwrap();
    tags.push("pb-tx".into());
    let (ok, _, err) = psql(
        &url,
        "SELECT job_id FROM shardq_enqueue('default', 'record', '{\"tag\": \"pb-psql\"}')",
    );
    assert!(ok, "{err}\n{}", bouncer.log_tail());
    tags.push("pb-psql".into());
    let (ok, _, err) = psql(&url, "SELECT * FROM shardq_route('x')");
    assert!(ok, "{err}");

    let calls = Calls::default();
    let report = calls.drain(&config, &set).await;
    assert_eq!(report.stats.succeeded as usize, tags.len());
    let by_tag = calls.by_tag.lock().unwrap().clone();
    for tag in &tags {
        assert_eq!(by_tag.get(tag), Some(&1), "{tag} ran exactly once");
    }
}

/// The least-privilege producer role (docs/least_privilege.sql) calls every
/// SQL entry point, the worker role enqueues too; the dashboard's role,
/// which may not enqueue, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producer_role_enqueues_from_sql_and_the_dashboard_role_cannot() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    let owner = connect(&shards.urls[0]).await;
    owner
        .batch_execute(include_str!("../../docs/least_privilege.sql"))
        .await
        .unwrap();
    owner
        .batch_execute(
            "DO $$ BEGIN \
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sql_producer') THEN \
                 CREATE ROLE sql_producer LOGIN IN ROLE shardq_producer; END IF; \
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sql_worker') THEN \
                 CREATE ROLE sql_worker LOGIN IN ROLE shardq_worker; END IF; \
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sql_dashboard') THEN \
                 CREATE ROLE sql_dashboard LOGIN IN ROLE shardq_dashboard; END IF; \
             END $$",
        )
        .await
        .unwrap();
    let producer = connect(&shards.urls[0].replace("postgres@", "sql_producer@")).await;
    let who: String = producer
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(who, "sql_producer");
    producer
        .query_one("SELECT * FROM shardq_route('k')", &[])
        .await
        .unwrap();
    let once = job(json!({})).dedup("lp");
    assert!(enqueue(&producer, &once).await.unwrap().is_new);
    assert!(!enqueue(&producer, &once).await.unwrap().is_new);
    enqueue(&producer, &job(json!({})).key("k")).await.unwrap();
    enqueue_many(
        &producer,
        &json!([{"queue": "default", "handler": "record"}]),
    )
    .await
    .unwrap();
    assert_eq!(count_all(&set).await, 3);
    let worker = connect(&shards.urls[0].replace("postgres@", "sql_worker@")).await;
    assert!(enqueue(&worker, &job(json!({}))).await.unwrap().is_new);
    assert_eq!(count_all(&set).await, 4);

    let dashboard = connect(&shards.urls[0].replace("postgres@", "sql_dashboard@")).await;
    let (code, text) = refusal(enqueue(&dashboard, &job(json!({}))).await.unwrap_err());
    assert_eq!(code, "42501", "insufficient privilege: {text}");
    assert_eq!(count_all(&set).await, 4);
}

/// Two callers race on one deduplication id, stepped by hand: the second
/// waits on the first's uncommitted row; when the first commits it gets the
/// first's job (not new), when the first rolls back it writes its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deduplication_race_admits_one_job() {
    let shards = TestShards::databases(1).await;
    let config = shards.config("");
    let set = shards.migrated(&config).await;
    for commit in [true, false] {
        let dedup_id = format!("race-{commit}");
        let mut first = connect(&shards.urls[0]).await;
        let second = connect(&shards.urls[0]).await;
        let tx = first.transaction().await.unwrap();
        let held = enqueue(&tx, &job(json!({})).dedup(&dedup_id))
            .await
            .unwrap();
        assert!(held.is_new);
        let args = job(json!({})).dedup(&dedup_id);
        let racing = tokio::spawn(async move { enqueue(&second, &args).await });
        // The second waits on the first's row (a lock wait on its transaction).
        let watcher = connect(&shards.urls[0]).await;
        common::wait_until(
            Duration::from_secs(30),
            "the second caller waits",
            || async {
                watcher
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity \
                     WHERE wait_event_type = 'Lock' AND query LIKE '%shardq_enqueue%'",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get::<_, i64>(0)
                    == 1
            },
        )
        .await;
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
        let got = racing.await.unwrap().unwrap();
        if commit {
            assert_eq!(
                got,
                Enqueued {
                    id: held.id,
                    is_new: false
                }
            );
        } else {
            assert!(got.is_new, "the holder rolled back: the second writes");
            assert_ne!(got.id, held.id);
        }
    }
    assert_eq!(count_all(&set).await, 2, "one job per deduplication id");
}
