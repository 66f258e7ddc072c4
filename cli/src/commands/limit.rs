//! `shardq limit set|list|clear`.

use crate::args::LimitAction;
use anyhow::Result;
use shardq::client::QueueLimits;
use shardq::config::Config;
use shardq::Client;
use std::time::Duration;

pub async fn run(config: &Config, action: LimitAction) -> Result<()> {
    let client = Client::new(config)?;
    match action {
        LimitAction::Set {
            queue,
            concurrency,
            rate,
            group_concurrency,
            group_rate,
        } => {
            let limits = QueueLimits {
                concurrency,
                rate,
                group_concurrency,
                group_rate,
            };
            client.set_queue_limits(&queue, limits).await?;
            println!("queue {queue}: {} across the fleet", describe(&limits));
        }
        LimitAction::Clear { queue } => {
            client
                .set_queue_limits(&queue, QueueLimits::default())
                .await?;
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
                        "{}\t{}\tin use {}\tby {} processes",
                        l.queue,
                        describe(&l.limits),
                        l.in_use.map_or_else(unknown, |n| n.to_string()),
                        l.holders.map_or_else(unknown, |n| n.to_string()),
                    );
                }
            }
        }
    }
    Ok(())
}

/// `concurrency 5, rate 20/s, each group concurrency 2` and the like.
fn describe(limits: &QueueLimits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = limits.concurrency {
        parts.push(format!("concurrency {n}"));
    }
    if let Some(r) = limits.rate {
        parts.push(format!("rate {}/{}", r.count, period(r.per)));
    }
    if let Some(n) = limits.group_concurrency {
        parts.push(format!("each group concurrency {n}"));
    }
    if let Some(r) = limits.group_rate {
        parts.push(format!("each group rate {}/{}", r.count, period(r.per)));
    }
    parts.join(", ")
}

fn period(per: Duration) -> String {
    match per.as_millis() {
        1_000 => "s".into(),
        60_000 => "min".into(),
        3_600_000 => "h".into(),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}
