//! One function per subcommand.

// The chaos run is a folder of its own beside `commands/`.
#[path = "../chaos/mod.rs"]
pub mod chaos;
mod demo;
mod enqueue;
mod job;
mod local;
mod status;
mod worker;

use crate::args::{Cli, Command};
use anyhow::{Context, Result};
use shardq::config::Config;
use shardq::shards::ShardSet;

pub async fn run(cli: Cli) -> Result<()> {
    let config = Config::load(cli.config.as_deref()).context("cannot load the configuration")?;
    match cli.command {
        Command::Local { action } => local::run(&config, action).await,
        Command::Migrate => migrate(&config).await,
        Command::Enqueue(args) => enqueue::run(&config, args).await,
        Command::Worker(args) => worker::run(config, args).await,
        Command::Job { action } => job::run(&config, action).await,
        Command::Status { json } => status::run(&config, json).await,
        Command::Demo { jobs } => demo::run(config, jobs).await,
        Command::Bench { what } => crate::bench::run(what).await,
        Command::Chaos(args) => chaos::run(args).await,
        Command::ChaosWorker => chaos::worker::run(config).await,
        Command::BenchWorker => crate::bench::scale::worker::run(config).await,
    }
}

pub async fn migrate(config: &Config) -> Result<()> {
    let shards = ShardSet::connect(config)?;
    let applied = shardq::migrate::migrate_all(&shards).await?;
    for (shard, versions) in shards.all().iter().zip(applied) {
        if versions.is_empty() {
            println!(
                "{}: up to date (version {})",
                shard.name,
                shardq::migrate::latest_version()
            );
        } else {
            println!("{}: applied {:?}", shard.name, versions);
        }
    }
    Ok(())
}
