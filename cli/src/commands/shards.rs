//! `shardq shards show`.

use crate::args::ShardsAction;
use anyhow::Result;
use shardq::client::MapReport;
use shardq::config::Config;
use shardq::Client;

pub async fn run(config: &Config, action: ShardsAction) -> Result<()> {
    let ShardsAction::Show { json } = action;
    let report = Client::new(config)?.map_report().await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print(&report);
    }
    Ok(())
}

/// One line for the epoch, one per range, one per shard that did not answer.
fn print(report: &MapReport) {
    println!(
        "shard map epoch {} ({} shards)",
        report.epoch, report.shard_count
    );
    for r in &report.ranges {
        let unfinished = if r.unfinished.is_empty() {
            "none".to_string()
        } else {
            r.unfinished
                .iter()
                .map(|(shard, n)| format!("{n} on {shard}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "    {}..{} → {}\tunfinished jobs: {unfinished}",
            r.first_key, r.end_key, r.shard
        );
    }
    for p in &report.unreachable {
        println!("    {}: not counted: {}", p.shard, p.error);
    }
}
