//! `shardq demo`: the first command on a fresh machine.

use super::{enqueue::enqueue_copies, local, migrate, worker};
use anyhow::Result;
use shardq::config::Config;
use shardq::Client;
use std::time::Instant;

const DEMO_QUEUE: &str = "demo";

pub async fn run(mut config: Config, jobs: usize) -> Result<()> {
    let opts = local::options(&config, None);
    println!(
        "starting {} local shards under {}",
        opts.shards,
        opts.root.display()
    );
    shardq_local::up(&opts).await?;
    migrate::run(&config).await?;
    let client = Client::new(&config)?;
    let started = Instant::now();
    let template = shardq::NewJob::new(DEMO_QUEUE, shardq::worker::NOOP, serde_json::json!({}));
    enqueue_copies(&client, &template, jobs).await?;
    println!(
        "enqueued {jobs} noop jobs in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    config.worker.queues = vec![DEMO_QUEUE.into()];
    let report = worker::run_worker(config, true, None).await?;
    worker::print_report(&report);
    println!("the local shards keep running; stop them with `shardq local down`");
    Ok(())
}
