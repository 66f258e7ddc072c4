//! One function per subcommand.

pub mod check;
mod dashboard;
mod demo;
mod enqueue;
mod job;
mod limit;
mod local;
mod metrics;
mod migrate;
mod queue;
mod reshard;
mod shards;
mod status;
mod worker;

use crate::args::{Cli, Command};
use anyhow::{Context, Result};
use shardq::config::Config;

pub async fn run(cli: Cli) -> Result<()> {
    let config_path = cli.config.as_deref();
    let command = match cli.command {
        Command::Bench { args } => return crate::forward::exec(config_path, None, args),
        Command::Chaos { args } => return crate::forward::exec(config_path, Some("chaos"), args),
        command => command,
    };
    let config = load(config_path).context("cannot load the configuration")?;
    match command {
        Command::Local { action } => local::run(&config, action).await,
        Command::Migrate => migrate::run(&config).await,
        Command::Enqueue(args) => enqueue::run(&config, args).await,
        Command::Worker(args) => worker::run(config, args).await,
        Command::Job { action } => job::run(&config, action).await,
        Command::Queue { action } => queue::run(&config, action).await,
        Command::Limit { action } => limit::run(&config, action).await,
        Command::Shards { action } => shards::run(&config, action).await,
        Command::Reshard(args) => reshard::run(&config, args).await,
        Command::Status { shards, json } => status::run(&config, shards, json).await,
        Command::Check(args) => check::run(&config, args).await,
        Command::Dashboard(args) => dashboard::run(&config, args).await,
        Command::Metrics(args) => metrics::run(&config, args).await,
        Command::Demo { jobs } => demo::run(config, jobs).await,
        Command::Bench { .. } | Command::Chaos { .. } => {
            unreachable!("handed to shardq-bench above")
        }
    }
}

/// The file given, else `./shards.toml`, else (said on stderr, so nobody
/// mistakes it for their fleet) the local shards `shardq local up` starts.
fn load(path: Option<&std::path::Path>) -> Result<Config, shardq::ConfigError> {
    if path.is_some() || std::path::Path::new(shardq::config::DEFAULT_CONFIG_PATH).exists() {
        return Config::load(path);
    }
    let config = Config::local()?;
    eprintln!(
        "shardq: no --config and no ./shards.toml: using the {} local shards under {} \
         (ports from {}; `shardq local up` starts them)",
        config.local.shards,
        config.local.dir.display(),
        config.local.base_port
    );
    Ok(config)
}
