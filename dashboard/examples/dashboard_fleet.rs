//! How long the operator's pages take as the shard list grows: one
//! PostgreSQL server on this machine holding 16, then 50 shards (one
//! database each), every shard with three queues: 20,000 succeeded jobs
//! finished over the last hour, 200 dead, 1,000 ready. Prints the median
//! of 5 requests of the overview, a queue's page and the shards page at
//! each size, side by side.
//!
//! Run: `cargo run --release -p shardq-dashboard --example dashboard_fleet`

#[path = "support/mod.rs"]
mod support;

use shardq::Client;
use shardq_dashboard::DashboardOptions;
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
        "{:<8} {:>14} {:>14} {:>14}",
        "shards", "overview ms", "queue ms", "shards ms"
    );
    for size in SIZES {
        let started = Instant::now();
        // A fresh list each size: a shard records the list it was migrated in.
        let mut toml = String::new();
        for i in 0..size {
            let name = format!("fleet{size}_{i}");
            create_database(&server.admin_url(), &name).await?;
            toml.push_str(&format!(
                "[[shards]]\nname = \"s{i}\"\nurl = \"{base}/{name}\"\npool_size = 4\n\n"
            ));
        }
        let config = shardq::Config::from_toml(&toml)?;
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
        let bound = shardq_dashboard::bind(DashboardOptions::new("127.0.0.1:0".parse()?)).await?;
        let addr = bound.local_addr()?;
        let stop = CancellationToken::new();
        tokio::spawn(bound.serve(client, stop.clone()));
        let http = reqwest::Client::new();
        let overview = median(&http, &format!("http://{addr}/")).await?;
        let queue = median(&http, &format!("http://{addr}/queues/emails")).await?;
        let shards_page = median(&http, &format!("http://{addr}/shards")).await?;
        println!(
            "{size:<8} {:>14.1} {:>14.1} {:>14.1}",
            ms(overview),
            ms(queue),
            ms(shards_page)
        );
        stop.cancel();
        shards.close();
    }
    Ok(())
}
