//! How long the operator's pages take as the shard list grows: one
//! PostgreSQL server on this machine holding 16, then 50 shards (one
//! database each), every shard with three queues: 20,000 succeeded jobs
//! finished over the last hour, 200 dead, 1,000 ready. Prints the median
//! of 5 requests of the overview, a queue's page and the shards page at
//! each size, side by side; then again at 50 shards once one of them holds
//! 10,000,000 more finished jobs (spread over 30 days, 1 % dead). Each
//! shard is read in parallel, so the page waits for its slowest shard: the
//! one with the long history. (Fifty shards of 10 M rows each would not fit
//! this host's disk.)
//!
//! Run: `cargo run --release -p shardq-dashboard --example dashboard_fleet`

#[path = "support/mod.rs"]
mod support;

use shardq::Client;
use shardq_dashboard::DashboardOptions;
use shardq_harness::ShardList;
use shardq_local::{create_database, EphemeralServer};
use std::time::Instant;
use support::{median, ms};
use tokio_util::sync::CancellationToken;

const FILL: &str = "
INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at)
    SELECT g % 65536, (ARRAY['emails', 'reports', 'billing'])[1 + g % 3], 'noop', 'succeeded', 1,
           now() - interval '1 hour' * random()
    FROM generate_series(1, 20000) g;
INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at, error)
    SELECT g % 65536, (ARRAY['emails', 'reports', 'billing'])[1 + g % 3], 'noop', 'dead', 3,
           now() - interval '1 hour' * random(), 'boom'
    FROM generate_series(1, 200) g;
INSERT INTO workflow_status (shard_key, queue, handler, status)
    SELECT g % 65536, (ARRAY['emails', 'reports', 'billing'])[1 + g % 3], 'noop', 'queued'
    FROM generate_series(1, 1000) g;
";

const SIZES: [usize; 2] = [16, 50];

/// The long history of one shard.
const HISTORY: &str = "
SET maintenance_work_mem = '512MB';
INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at, error)
    SELECT g % 65536, (ARRAY['emails', 'reports', 'billing'])[1 + g % 3], 'noop',
           CASE WHEN g % 100 = 0 THEN 'dead' ELSE 'succeeded' END, 1,
           now() - interval '30 days' * random(),
           CASE WHEN g % 100 = 0 THEN 'timeout after ' || g % 60 || ' s' END
    FROM generate_series(1, 10000000) g;
";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let server = EphemeralServer::start().await?;
    let base = server
        .admin_url()
        .rsplit_once('/')
        .map(|(b, _)| b.to_string())
        .ok_or_else(|| anyhow::anyhow!("no database in the admin URL"))?;
    println!(
        "machine: {} CPUs; PostgreSQL and the dashboard on the same machine",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:<22} {:>14} {:>14} {:>14}",
        "shards", "overview ms", "queue ms", "shards ms"
    );
    for size in SIZES {
        let started = Instant::now();
        // A fresh list each size: a shard records the list it was migrated in.
        let mut urls = Vec::new();
        for i in 0..size {
            let name = format!("fleet{size}_{i}");
            create_database(&server.admin_url(), &name).await?;
            urls.push(format!("{base}/{name}"));
        }
        let config = shardq::Config::from_toml(&ShardList::numbered(urls).pool_size(4).toml(""))?;
        let shards = shardq::shards::ShardSet::connect(&config)?;
        shardq::migrate::migrate_all(&shards).await?;
        for shard in shards.all() {
            let db = shard.user_client().await?;
            db.batch_execute(FILL).await?;
            db.batch_execute("VACUUM ANALYZE workflow_status").await?;
        }
        eprintln!(
            "{size} shards ready in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let client = Client::from_shards(shards.clone(), config.limits.clone());
        measure(&client, &size.to_string()).await?;
        if size == 50 {
            let started = Instant::now();
            let db = shards.get(0).user_client().await?;
            db.batch_execute(HISTORY).await?;
            db.batch_execute("VACUUM ANALYZE workflow_status").await?;
            eprintln!(
                "10 M finished rows on s0 in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            measure(&client, "50, s0 of 10 M rows").await?;
        }
        shards.close();
    }
    Ok(())
}

/// Serves a dashboard over `client`'s shards and prints the median of each
/// page, timed once the first invariant check has answered (it runs in the
/// background every 15 s, also while the pages are timed).
async fn measure(client: &Client, label: &str) -> anyhow::Result<()> {
    let bound = shardq_dashboard::bind(DashboardOptions::new("127.0.0.1:0".parse()?)).await?;
    let addr = bound.local_addr()?;
    let stop = CancellationToken::new();
    tokio::spawn(bound.serve(client.clone(), stop.clone()));
    let http = reqwest::Client::new();
    let until = Instant::now() + std::time::Duration::from_secs(120);
    while !http
        .get(format!("http://{addr}/"))
        .send()
        .await?
        .text()
        .await?
        .contains("data-broken")
    {
        anyhow::ensure!(Instant::now() < until, "no invariant verdict in 2 minutes");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let overview = median(&http, &format!("http://{addr}/")).await?;
    let queue = median(&http, &format!("http://{addr}/queues/emails")).await?;
    let shards_page = median(&http, &format!("http://{addr}/shards")).await?;
    println!(
        "{label:<22} {:>14.1} {:>14.1} {:>14.1}",
        ms(overview),
        ms(queue),
        ms(shards_page)
    );
    stop.cancel();
    Ok(())
}
