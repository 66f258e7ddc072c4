//! `shardq limit set|list|clear`.

use crate::args::LimitAction;
use anyhow::Result;
use shardq::config::Config;
use shardq::Client;

pub async fn run(config: &Config, action: LimitAction) -> Result<()> {
    let client = Client::new(config)?;
    match action {
        LimitAction::Set { queue, concurrency } => {
            client.set_queue_limit(&queue, Some(concurrency)).await?;
            println!("queue {queue}: at most {concurrency} jobs at once across the fleet");
        }
        LimitAction::Clear { queue } => {
            client.set_queue_limit(&queue, None).await?;
            println!("queue {queue}: no limit");
        }
        LimitAction::List { json } => {
            let limits = client.queue_limits().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&limits)?);
            } else if limits.is_empty() {
                println!("no queue is limited");
            } else {
                let unknown = || "?".to_string();
                for l in limits {
                    println!(
                        "{}\tconcurrency {}\tin use {}\tby {} processes",
                        l.queue,
                        l.concurrency,
                        l.in_use.map_or_else(unknown, |n| n.to_string()),
                        l.holders.map_or_else(unknown, |n| n.to_string()),
                    );
                }
            }
        }
    }
    Ok(())
}
