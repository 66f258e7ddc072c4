//! Replacing a shard's server (`shardq reshard --to` with another server at
//! one place of the list): nothing moves, so the new server must already be
//! a physical copy of the old one. Here the copy is `CREATE DATABASE ...
//! TEMPLATE` of the shard's database (a file copy, as a promoted replica or
//! a base backup is). An empty database and another place's database are
//! refused, naming what they record; the copy is accepted, and a worker on
//! the new list runs the old shard's jobs there, each once, per key in
//! order, while the replaced database keeps its jobs unrun.

use crate::common;

use common::{ShardList, TestShards};
use shardq::shards::ShardSet;
use shardq::{Client, HandlerRegistry, NewJob, Worker};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const JOBS: usize = 200;
const KEYS: usize = 10;

/// Runs `statement` on the server's admin database.
async fn admin(url: &str, statement: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("admin connection");
    let connection = tokio::spawn(connection);
    client.batch_execute(statement).await.expect(statement);
    drop(client);
    let _ = connection.await;
}

fn database(url: &str) -> String {
    url.rsplit_once('/')
        .expect("url has a database")
        .1
        .to_string()
}

async fn statuses(url: &str) -> Vec<(String, i64)> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connection");
    tokio::spawn(connection);
    let rows = client
        .query(
            "SELECT status::text, count(*) FROM workflow_status GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await
        .expect("statuses");
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacing_server_must_be_a_copy_and_then_runs_the_old_shards_jobs() {
    let shards = TestShards::databases(2).await;
    let admin_url = shards.servers[0].admin_url();
    let base = admin_url.rsplit_once('/').unwrap().0.to_string();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, urls: &[String]| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            ShardList::numbered(urls).toml("[worker]\nqueues = [\"replaced\"]\n"),
        )
        .unwrap();
        path
    };
    let old = write("old.toml", &shards.urls);
    assert!(
        shardq_harness::exe::shardq_output(&old, &["migrate"])
            .await
            .0
    );

    let config = shardq::Config::load(Some(&old)).unwrap();
    let set = ShardSet::connect(&config).unwrap();
    let client = Client::from_shards(set.clone(), config.limits.clone());
    // Half the keys on each shard (range 0..32768 is shard 0's).
    let mut names: Vec<String> = Vec::new();
    for half in [0..32_768, 32_768..65_536] {
        let on_half = (0..)
            .map(|n| format!("k{n}"))
            .filter(|k| half.contains(&shardq::router::shard_key_for(k)));
        names.extend(on_half.take(KEYS / 2));
    }
    let jobs = (0..JOBS)
        .map(|i| {
            let payload = serde_json::json!({ "key": i % KEYS, "revision": i / KEYS });
            NewJob::new("replaced", "record", payload).ordering_key(names[i % KEYS].clone())
        })
        .collect();
    client.enqueue_many(jobs).await.expect("enqueue");
    drop((client, set));

    // The copy is taken with the old database idle (as a replica is
    // promoted once the old server stops taking writes).
    let (old_db, copy_db) = (database(&shards.urls[1]), "replacing_copy");
    for statement in [
        format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{old_db}'"
        ),
        format!("CREATE DATABASE {copy_db} TEMPLATE {old_db}"),
        "CREATE DATABASE replacing_empty".to_string(),
    ] {
        admin(&admin_url, &statement).await;
    }
    let copy_url = format!("{base}/{copy_db}");
    let empty = write(
        "empty.toml",
        &[shards.urls[0].clone(), format!("{base}/replacing_empty")],
    );
    let other_place = write(
        "other-place.toml",
        &[shards.urls[0].clone(), shards.urls[0].clone()],
    );
    let copied = write("copy.toml", &[shards.urls[0].clone(), copy_url.clone()]);

    let (ok, text) =
        shardq_harness::exe::shardq_output(&old, &["reshard", "--to", empty.to_str().unwrap()])
            .await;
    assert!(!ok, "{text}");
    assert!(
        text.contains("is not a copy of the shard it replaces: it records no shard map")
            && text.contains("physical copy"),
        "{text}"
    );
    let (ok, text) = shardq_harness::exe::shardq_output(
        &old,
        &["reshard", "--to", other_place.to_str().unwrap()],
    )
    .await;
    assert!(!ok, "{text}");
    assert!(
        text.contains("it records that it is shard 0 of 2"),
        "{text}"
    );
    let (ok, text) =
        shardq_harness::exe::shardq_output(&old, &["reshard", "--to", copied.to_str().unwrap()])
            .await;
    assert!(ok, "{text}");
    assert!(
        text.contains("shard 1: `s1` is a copy of `s1`") && text.contains("nothing to move"),
        "{text}"
    );
    let (ok, text) = shardq_harness::exe::shardq_output(&copied, &["check"]).await;
    assert!(ok, "the new list passes `shardq check`: {text}");

    // A worker on the new list runs every job once, per key in order.
    let calls: Arc<Mutex<Vec<(i64, i64)>>> = Arc::default();
    let mut registry = HandlerRegistry::new();
    let recorded = calls.clone();
    registry.register("record", move |ctx| {
        let calls = recorded.clone();
        async move {
            let key = ctx.payload["key"].as_i64().unwrap();
            let revision = ctx.payload["revision"].as_i64().unwrap();
            calls.lock().unwrap().push((key, revision));
            Ok(serde_json::Value::Null)
        }
    });
    let new_config = shardq::Config::load(Some(&copied)).unwrap();
    let new_set = ShardSet::connect(&new_config).unwrap();
    let worker = Worker::new(new_config, new_set.clone(), registry);
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    common::wait_until(Duration::from_secs(60), "every job ran", || async {
        calls.lock().unwrap().len() >= JOBS
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    running.await.expect("worker");

    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), JOBS, "each job ran once");
    for key in 0..KEYS as i64 {
        let revisions: Vec<i64> = calls
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, r)| *r)
            .collect();
        let want: Vec<i64> = (0..(JOBS / KEYS) as i64).collect();
        assert_eq!(revisions, want, "key {key} ran in enqueue order");
    }
    let on_copy = statuses(&copy_url).await;
    assert!(
        on_copy.len() == 1 && on_copy[0].0 == "succeeded" && on_copy[0].1 > 0,
        "the copy ran its jobs: {on_copy:?}"
    );
    let on_old = statuses(&shards.urls[1]).await;
    let old_total: i64 = on_old.iter().map(|(_, n)| n).sum();
    assert!(
        on_old.iter().all(|(s, _)| s != "succeeded") && old_total == on_copy[0].1,
        "the replaced database kept its jobs unrun: {on_old:?}"
    );
}
