//! `shardq limit set|list|clear`.

use crate::args::LimitAction;
use anyhow::Result;
use shardq::client::{QueueLimits, StartRate};
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

/// `N/s`, `N/min`, `N/h`, `N/<D>s`, `N/<D>ms`.
pub fn parse_rate(text: &str) -> Result<StartRate, String> {
    let bad = || format!("`{text}`: give N/PERIOD, e.g. 100/s, 1000/min, 5/h, 10/500ms");
    let (count, per) = text.split_once('/').ok_or_else(bad)?;
    let count: u32 = count.trim().parse().map_err(|_| bad())?;
    let per = per.trim();
    let ms: u64 = match per {
        "s" | "sec" | "second" => 1_000,
        "m" | "min" | "minute" => 60_000,
        "h" | "hour" => 3_600_000,
        _ => {
            let (digits, unit) =
                per.split_at(per.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?);
            let n: u64 = digits.parse().map_err(|_| bad())?;
            match unit {
                "ms" => n,
                "s" => n * 1_000,
                "min" => n * 60_000,
                _ => return Err(bad()),
            }
        }
    };
    if count == 0 || ms == 0 {
        return Err(format!(
            "`{text}`: a rate needs a count and a period above 0"
        ));
    }
    Ok(StartRate {
        count,
        per: Duration::from_millis(ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_in_their_units_and_bad_ones_say_what_to_give() {
        let ms = |t: &str| parse_rate(t).map(|r| (r.count, r.per.as_millis()));
        assert_eq!(ms("100/s"), Ok((100, 1_000)));
        assert_eq!(ms("1000/min"), Ok((1000, 60_000)));
        assert_eq!(ms("5/h"), Ok((5, 3_600_000)));
        assert_eq!(ms("10/500ms"), Ok((10, 500)));
        assert_eq!(ms("3/2s"), Ok((3, 2_000)));
        for bad in ["100", "x/s", "10/fortnight", "0/s", "5/0ms"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert!(parse_rate("10/week").unwrap_err().contains("100/s"));
    }
}
