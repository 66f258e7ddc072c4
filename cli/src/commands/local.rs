//! `shardq local up|down|status`.

use crate::args::LocalAction;
use anyhow::Result;
use shardq::config::Config;
use shardq_local::{self as local, LocalOptions};

pub fn options(config: &Config, shards: Option<usize>) -> LocalOptions {
    LocalOptions {
        root: config.local.dir.clone(),
        base_port: config.local.base_port,
        shards: shards.unwrap_or(config.local.shards),
    }
}

pub async fn run(config: &Config, action: LocalAction) -> Result<()> {
    match action {
        LocalAction::Up { shards } => {
            for server in local::up(&options(config, shards)).await? {
                println!("shard {} up: {}", server.index, server.url());
            }
        }
        LocalAction::Down { shards } => {
            local::down(&options(config, shards))?;
            println!("local servers stopped");
        }
        LocalAction::Status { shards } => {
            for server in local::servers(&options(config, shards)) {
                let state = if server.is_running() { "up" } else { "down" };
                println!("shard {} {state}: {}", server.index, server.url());
            }
        }
    }
    Ok(())
}
