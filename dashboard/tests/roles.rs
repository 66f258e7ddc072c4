//! The dashboard and the worker heartbeat under the least-privilege roles of
//! docs/least_privilege.sql: `shardq_worker` writes heartbeats,
//! `shardq_dashboard` shows every page and does every action,
//! `shardq_dashboard_ro` shows the pages and can change nothing.

mod common;

use common::{loopback, serve, Handlers, Shards};
use reqwest::StatusCode;
use shardq::{Client, Config};
use std::time::Duration;

const LEAST_PRIVILEGE: &str = include_str!("../../docs/least_privilege.sql");

/// `shards` with every URL's user replaced by `user`.
fn as_user(shards: &Shards, user: &str, extra: &str) -> Config {
    let urls: Vec<String> = shards
        .urls
        .iter()
        .map(|u| u.replacen("://postgres@", &format!("://{user}@"), 1))
        .collect();
    assert!(urls.iter().all(|u| u.contains(user)), "{urls:?}");
    Config::from_toml(&common::toml(&urls, extra)).unwrap()
}

async fn as_owner(shards: &Shards, sql: &str) {
    for shard in shards.set.all() {
        shard
            .client()
            .await
            .unwrap()
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_heartbeats_work_under_their_least_privilege_roles() {
    let shards = Shards::start(2).await;
    as_owner(&shards, LEAST_PRIVILEGE).await;
    as_owner(
        &shards,
        "DO $$ BEGIN \
           IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'app_worker') THEN \
             CREATE ROLE app_worker LOGIN IN ROLE shardq_worker; \
             CREATE ROLE app_dash LOGIN IN ROLE shardq_dashboard; \
             CREATE ROLE app_dash_ro LOGIN IN ROLE shardq_dashboard_ro; \
           END IF; END $$",
    )
    .await;

    // Jobs in every state, made by a worker that logs in as app_worker.
    let worker_config = as_user(&shards, "app_worker", common::WORKER);
    let worker_shards = Shards {
        config: worker_config.clone(),
        set: shardq::shards::ShardSet::connect(&worker_config).unwrap(),
        client: Client::new(&worker_config).unwrap(),
        ..shards
    };
    let handlers = Handlers::new();
    let (fixture, worker, stop_worker) =
        common::jobs_in_every_state(&worker_shards, &handlers, false).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // Read-only role: every page, the worker's heartbeat rows, no change.
    let ro = Client::new(&as_user(&worker_shards, "app_dash_ro", "")).unwrap();
    let (addr, _stop) = serve(
        ro.clone(),
        shardq_dashboard::DashboardOptions {
            read_only: true,
            ..loopback()
        },
    )
    .await;
    let overview = http
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        overview.matches("2 of 2 shards answered").count(),
        1,
        "{overview}"
    );
    assert_eq!(
        overview.matches("data-worker=").count(),
        2,
        "app_worker's heartbeats: {overview}"
    );
    for path in [
        "/jobs?state=dead".to_string(),
        format!("/jobs/{}", fixture.dead_on_0),
    ] {
        let page = http
            .get(format!("http://{addr}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), StatusCode::OK, "{path}");
    }
    let err = ro.retry(fixture.dead_on_0).await.unwrap_err();
    assert!(
        shardq::error_chain(&err).contains("permission denied"),
        "{err}"
    );

    // Action role: retry, cancel, pause, resume; but no enqueue, no delete.
    let dash = Client::new(&as_user(&worker_shards, "app_dash", "")).unwrap();
    let (addr, _stop) = serve(dash.clone(), loopback()).await;
    let page = http
        .get(format!("http://{addr}/jobs/{}", fixture.dead_on_0))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(dash.retry(fixture.dead_on_0).await.unwrap());
    assert!(dash.cancel(fixture.dead_on_0).await.unwrap().is_some());
    dash.pause_queue("dash").await.unwrap();
    assert_eq!(dash.paused_queues().await.unwrap().len(), 1);
    dash.resume_queue("dash").await.unwrap();
    assert!(dash
        .enqueue(shardq::NewJob::new("dash", "ok", serde_json::json!({})))
        .await
        .is_err());
    let db = dash.shards().get(0).client().await.unwrap();
    for sql in [
        "DELETE FROM workflow_status",
        "DELETE FROM shardq_workers",
        "INSERT INTO workflow_steps (shard_key, workflow_id, step_name) VALUES (0, 1, 'x')",
    ] {
        let err = db.batch_execute(sql).await.unwrap_err();
        // 42501: insufficient_privilege.
        assert_eq!(
            err.code().map(|c| c.code()),
            Some("42501"),
            "{sql}: {err:?}"
        );
    }
    stop_worker.cancel();
    tokio::time::timeout(Duration::from_secs(30), worker)
        .await
        .unwrap()
        .unwrap();
}
