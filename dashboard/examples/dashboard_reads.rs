//! How long the dashboard's pages take over a shard with a long history:
//! one PostgreSQL server on this machine, one shard holding 1,000,000
//! succeeded jobs (finished over the last hour, so ~83,000 in the chart's
//! 5-minute window), 10,000 dead and 100,000 ready ones. Prints the median
//! of 5 requests per page, for the first page of a list and for its 40th
//! (keyset: a deep page costs what the first does).
//!
//! Run: `cargo run --release -p shardq-dashboard --example dashboard_reads`

#[path = "support/mod.rs"]
mod support;

use shardq::Client;
use shardq_dashboard::DashboardOptions;
use shardq_local::EphemeralServer;
use std::time::Instant;
use support::{median, ms};
use tokio_util::sync::CancellationToken;

const FILL: &str = "
SET maintenance_work_mem = '256MB';
INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at)
    SELECT g % 65536, 'q', 'noop', 'succeeded', 1, now() - interval '1 hour' * random()
    FROM generate_series(1, 1000000) g;
INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at, error)
    SELECT g % 65536, 'q', 'noop', 'dead', 3, now() - interval '1 hour' * random(), 'boom'
    FROM generate_series(1, 10000) g;
INSERT INTO workflow_status (shard_key, queue, handler, status, priority)
    SELECT g % 65536, 'q', 'noop', 'queued', g % 3 FROM generate_series(1, 100000) g;
";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let server = EphemeralServer::start().await?;
    let toml = format!("[[shards]]\nname = \"s0\"\nurl = \"{}\"\n", server.url());
    let config = shardq::Config::from_toml(&toml)?;
    let shards = shardq::shards::ShardSet::connect(&config)?;
    shardq::migrate::migrate_all(&shards).await?;
    let started = Instant::now();
    let db = shards.get(0).user_client().await?;
    db.batch_execute(FILL).await?;
    // Its own statement: VACUUM refuses to run in the implicit transaction
    // of a multi-statement batch.
    db.batch_execute("VACUUM ANALYZE workflow_status").await?;
    println!(
        "filled 1,110,000 rows in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let client = Client::from_shards(shards.clone(), config.limits.clone());
    let bound = shardq_dashboard::bind(DashboardOptions::new("127.0.0.1:0".parse()?)).await?;
    let addr = bound.local_addr()?;
    let stop = CancellationToken::new();
    tokio::spawn(bound.serve(client, stop.clone()));
    let http = reqwest::Client::new();
    println!(
        "machine: {} CPUs; PostgreSQL and the dashboard on the same machine",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("page                                  median of 5");
    measure(
        &http,
        &format!("http://{addr}/"),
        "overview (counts, chart, workers)",
    )
    .await?;
    for state in ["ready", "dead", "succeeded"] {
        let first = format!("http://{addr}/jobs?state={state}");
        measure(&http, &first, &format!("{state}: page 1 (50 jobs)")).await?;
        let deep = follow(&http, addr, &first, 39).await?;
        measure(&http, &deep, &format!("{state}: page 40")).await?;
    }
    stop.cancel();
    Ok(())
}

async fn measure(http: &reqwest::Client, url: &str, what: &str) -> anyhow::Result<()> {
    println!("{what:<38} {:>7.1} ms", ms(median(http, url).await?));
    Ok(())
}

/// The URL `hops` "Next page" links after `first`.
async fn follow(
    http: &reqwest::Client,
    addr: std::net::SocketAddr,
    first: &str,
    hops: usize,
) -> anyhow::Result<String> {
    let mut url = first.to_string();
    for _ in 0..hops {
        let html = http.get(&url).send().await?.text().await?;
        let next = html
            .split("id=\"next\" href=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .ok_or_else(|| anyhow::anyhow!("no next page after {url}"))?;
        url = format!("http://{addr}{}", next.replace("&amp;", "&"));
    }
    Ok(url)
}
