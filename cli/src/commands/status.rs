//! `shardq status`.

use anyhow::Result;
use shardq::client::ScheduleStatus;
use shardq::config::Config;
use shardq::Client;

pub async fn run(config: &Config, json: bool) -> Result<()> {
    let client = Client::new(config)?;
    let report = client.status_with(&config.schedules).await;
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
        print_schedules(&shard.schedules);
    }
    Ok(())
}

/// The schedules that live on one shard, one line each.
fn print_schedules(schedules: &[ScheduleStatus]) {
    let or_none = |t: &Option<String>| t.clone().unwrap_or_else(|| "none".into());
    for s in schedules {
        println!(
            "    schedule {} ({} {}, queue {}, missed: {}): last tick {}, next tick {}{}",
            s.name,
            s.cron,
            s.timezone,
            s.queue,
            s.missed.as_str(),
            or_none(&s.last_tick),
            or_none(&s.next_tick),
            s.error
                .as_deref()
                .map(|e| format!(" (last tick unknown: {e})"))
                .unwrap_or_default()
        );
    }
}
