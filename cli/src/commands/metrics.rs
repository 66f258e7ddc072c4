//! `shardq metrics`: the fleet's backlog exporter, with the invariants of
//! `shardq check` (`shardq_invariant_violations`).

use crate::args::MetricsArgs;
use anyhow::{bail, Context, Result};
use shardq::client::CheckOptions;
use shardq::config::Config;
use shardq::shards::ShardSet;
use shardq::Client;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub async fn run(config: &Config, args: MetricsArgs) -> Result<()> {
    if args.shard_timeout_ms == 0 {
        bail!("--shard-timeout-ms must be at least 1");
    }
    let check = CheckOptions {
        deadline: Duration::from_millis(args.shard_timeout_ms),
        ..CheckOptions::from_config(config)
    };
    let client = Arc::new(Client::from_shards(
        ShardSet::connect(config)?,
        config.limits.clone(),
    ));
    let queues: Arc<[String]> = config.worker.queues.clone().into();
    let shutdown = CancellationToken::new();
    let render = move || {
        let (client, queues) = (client.clone(), queues.clone());
        async move { shardq::prometheus::backlog::scrape_with_check(&client, &queues, &check).await }
    };
    shardq::prometheus::serve(args.listen, render, shutdown.clone())
        .await
        .with_context(|| format!("cannot listen for metrics on {}", args.listen))?;
    stopped().await?;
    shutdown.cancel();
    Ok(())
}

/// Waits for SIGINT or SIGTERM.
async fn stopped() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
