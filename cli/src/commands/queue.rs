//! `shardq queue pause|resume|list`.

use crate::args::QueueAction;
use anyhow::Result;
use shardq::config::Config;
use shardq::Client;

pub async fn run(config: &Config, action: QueueAction) -> Result<()> {
    let client = Client::new(config)?;
    match action {
        QueueAction::Pause { queue } => {
            client.pause_queue(&queue).await?;
            println!("queue {queue} paused on every shard");
        }
        QueueAction::Resume { queue } => {
            client.resume_queue(&queue).await?;
            println!("queue {queue} resumed on every shard");
        }
        QueueAction::List { json } => {
            let paused = client.paused_queues().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&paused)?);
            } else if paused.is_empty() {
                println!("no queue is paused");
            } else {
                for p in paused {
                    println!(
                        "{}\tpaused since {}\ton {}",
                        p.queue,
                        p.paused_at,
                        p.shards.join(", ")
                    );
                }
            }
        }
    }
    Ok(())
}
