//! `shardq status`.

use anyhow::Result;
use shardq::config::Config;
use shardq::Client;

pub async fn run(config: &Config, json: bool) -> Result<()> {
    let client = Client::new(config)?;
    let report = client.status().await;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    for shard in &report {
        match (&shard.counts, &shard.error) {
            (Some(counts), _) => {
                println!("{} ({}): up", shard.shard, shard.target);
                if let Some(n) = shard.connections {
                    println!(
                        "    connections: {} of max_connections {} ({} shardq, {} shardq-user, all processes)",
                        n.total, n.max, n.shardq, n.user
                    );
                }
                if counts.is_empty() {
                    println!("    no jobs");
                }
                for c in counts {
                    let approx = if c.estimated { "~" } else { "" };
                    println!(
                        "    {:<20} {:<10} {:>12}",
                        c.queue,
                        c.status,
                        format!("{approx}{}", c.count)
                    );
                }
            }
            (None, error) => println!(
                "{} ({}): unreachable: {}",
                shard.shard,
                shard.target,
                error.as_deref().unwrap_or("unknown error")
            ),
        }
    }
    Ok(())
}
