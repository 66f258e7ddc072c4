//! `shardq dashboard`.

use crate::args::DashboardArgs;
use anyhow::{Context, Result};
use shardq::config::Config;
use shardq::Client;
use shardq_dashboard::{Auth, DashboardOptions};
use tokio_util::sync::CancellationToken;

pub async fn run(config: &Config, args: DashboardArgs) -> Result<()> {
    let auth = Auth::load(args.token_file.as_deref(), args.basic_auth_file.as_deref())
        .context("cannot load the dashboard's credentials")?;
    let options = DashboardOptions {
        read_only: args.read_only,
        auth,
        stale_after: shardq::client::CheckOptions::from_config(config).stale_after,
        ..DashboardOptions::new(args.listen)
    };
    let client = Client::new(config)?;
    // A shard at another schema version would fail every page; an
    // unreachable one only warns (the pages say which).
    super::worker::check_schema(client.shards()).await?;
    let bound = shardq_dashboard::bind(options).await?;
    let addr = bound.local_addr()?;
    // Tests and scripts read the address from this line (the port of `:0`).
    println!("dashboard listening on http://{addr}/");
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    tokio::spawn({
        let stop = shutdown.clone();
        async move {
            if let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            {
                term.recv().await;
                stop.cancel();
            }
        }
    });
    bound.serve(client, shutdown).await?;
    Ok(())
}
