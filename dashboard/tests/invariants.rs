//! The overview's invariant line, from `Client::check` run in the
//! background: "checking" before its first answer, "all hold" on a healthy
//! shard, the broken invariant and its shard once one is broken (at the
//! next check).

mod common;

use common::{loopback, serve, Shards};
use shardq::store::jobs::{self, Claim, ClaimParams};
use shardq::NewJob;
use std::time::Duration;

async fn overview(addr: std::net::SocketAddr) -> String {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The overview once its invariant line contains `wanted`.
async fn overview_saying(addr: std::net::SocketAddr, wanted: &str) -> String {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let page = overview(addr).await;
        if page.contains(wanted) || std::time::Instant::now() > until {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_says_whether_every_invariant_holds() {
    let shards = Shards::start(1).await;
    let job = || NewJob::new("dash", "noop", serde_json::json!({})).ordering_key("k");
    let ids = shards
        .client
        .enqueue_many(vec![job(), job()])
        .await
        .unwrap();
    let params = ClaimParams {
        queue: "dash",
        limit: 1,
        owner: "w",
        lease: Duration::from_secs(3600),
        mode: shardq::config::DequeueMode::Gated { slots: 2 },
    };
    let Claim::Jobs(claimed) = jobs::claim(shards.set.get(0), params).await.unwrap() else {
        panic!("a job to claim");
    };
    assert_eq!(claimed[0].id, ids[0]);
    // Checked every 1.5 s here (15 s by default).
    let mut options = loopback();
    options.check_interval = Duration::from_millis(1_500);
    let (addr, _stop) = serve(shards.client.clone(), options).await;

    let page = overview_saying(addr, "data-broken").await;
    assert!(page.contains("data-broken=\"0\""), "{page}");
    assert!(page.contains("all hold"), "{page}");

    // The holder ends without its key's next job being queued: stranded.
    shards
        .set
        .get(0)
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE workflow_status SET status = 'succeeded', owner = NULL, \
             lease_expires_at = NULL, finished_at = now() WHERE shard_key = $1 AND id = $2",
            &[&ids[0].shard_key, &ids[0].id],
        )
        .await
        .unwrap();
    // Shown at the next check.
    let page = overview_saying(addr, "data-broken=\"1\"").await;
    assert!(page.contains("data-broken=\"1\""), "{page}");
    assert!(page.contains("stranded_key on s0: 1"), "{page}");
    assert!(!page.contains("all hold"), "{page}");
}
