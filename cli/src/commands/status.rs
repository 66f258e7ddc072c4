//! `shardq status`: one line per queue over every shard first, each
//! shard's own counts with `--shards`.

use anyhow::Result;
use shardq::client::{
    summarize, Holder, Horizon, QueueSummary, ScheduleStatus, ShardStatus, StateCounts,
    ALL_FINISHED,
};
use shardq::config::Config;
use shardq::Client;

/// A shard whose horizon a transaction has held this long is named in the
/// summary, not only under `--shards`: by then vacuum has removed nothing
/// for a minute, and a queue making thousands of dead versions a second
/// starts to feel it (docs/operations.md, "A long transaction holds the
/// horizon").
const HORIZON_HELD_WARN_S: f64 = 60.0;

/// The columns of the queue table: (state, heading).
const COLUMNS: [(&str, &str); 8] = [
    ("queued", "ready"),
    ("delayed", "scheduled"),
    ("retrying", "retrying"),
    ("running", "running"),
    ("waiting", "waiting"),
    ("parked", "parked"),
    ("dead", "dead"),
    ("succeeded", "succeeded"),
];

pub async fn run(config: &Config, per_shard: bool, json: bool) -> Result<()> {
    let client = Client::new(config)?;
    let shards = client.status_with(&config.schedules).await;
    let queues = summarize(&shards);
    let unanswered: Vec<&ShardStatus> = shards.iter().filter(|s| s.counts.is_none()).collect();
    let bounded: Vec<&ShardStatus> = shards.iter().filter(|s| s.backlog_bounded).collect();
    if json {
        // `unanswered`: shards whose jobs are not in `queues`; `bounded`:
        // shards whose waiting and scheduled jobs are not.
        let names = |of: &[&ShardStatus]| of.iter().map(|s| s.shard.clone()).collect::<Vec<_>>();
        let report = serde_json::json!({
            "queues": queues,
            "unanswered": names(&unanswered),
            "bounded": names(&bounded),
            "shards": shards,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    print_queues(&queues, !bounded.is_empty());
    println!(
        "{} of {} shards answered{}",
        shards.len() - unanswered.len(),
        shards.len(),
        finished_estimate(&shards)
    );
    for s in &unanswered {
        println!(
            "{} ({}): no answer: {}",
            s.shard,
            s.target,
            s.error.as_deref().unwrap_or("unknown error")
        );
    }
    for s in &bounded {
        println!(
            "{} ({}): ready and running jobs only (counts marked + leave the others out): \
             counting its waiting, retrying, delayed and parked jobs ran past half the \
             shard's deadline (a long transaction holding the xmin horizon, or millions of \
             such jobs; docs/operations.md)",
            s.shard, s.target
        );
    }
    for s in &shards {
        if let Some(h) = s.horizon.as_ref() {
            if h.oldest_seconds() >= HORIZON_HELD_WARN_S {
                println!(
                    "{}: {}; vacuum removes nothing newer (docs/operations.md)",
                    s.shard,
                    held_for(h)
                );
            }
        }
    }
    for s in &shards {
        print_schedules(&s.schedules);
    }
    if per_shard {
        for s in shards.iter().filter(|s| s.counts.is_some()) {
            print_shard(s, &shards);
        }
    }
    Ok(())
}

/// The queue table; with `some_bounded`, the counts of the states a
/// bounded shard left out are marked `+` (at least this many).
fn print_queues(queues: &[QueueSummary], some_bounded: bool) {
    if queues.is_empty() {
        println!("no jobs on any shard that answered");
        return;
    }
    print!("{:<20}", "queue");
    for (_, heading) in COLUMNS {
        print!(" {heading:>10}");
    }
    println!(
        " {:>13}  {:<12} {:>6}",
        "oldest ready", "on shard", "shards"
    );
    for q in queues {
        print!("{:<20}", q.queue);
        for (state, _) in COLUMNS {
            let at_least = some_bounded && StateCounts::left_out_when_bounded(state);
            let count = format!("{}{}", q.count(state), if at_least { "+" } else { "" });
            print!(" {count:>10}");
        }
        let oldest = q
            .oldest_ready_s
            .map_or_else(|| "-".to_string(), |s| format!("{s:.1} s"));
        println!(
            " {oldest:>13}  {:<12} {:>6}",
            q.oldest_on.as_deref().unwrap_or("-"),
            q.shards
        );
    }
}

/// `, ~N finished jobs (estimate)` when some shard has too many to count.
fn finished_estimate(shards: &[ShardStatus]) -> String {
    let estimate: i64 = shards
        .iter()
        .flat_map(|s| s.counts.iter().flatten())
        .filter(|c| c.queue == ALL_FINISHED)
        .map(|c| c.count)
        .sum();
    if estimate > 0 {
        format!("; ~{estimate} finished jobs on shards with too many to count by queue")
    } else {
        String::new()
    }
}

fn print_shard(shard: &ShardStatus, all: &[ShardStatus]) {
    let bounded = if shard.backlog_bounded {
        ", bounded: ready and running jobs only"
    } else {
        ""
    };
    println!("{} ({}): up{bounded}", shard.shard, shard.target);
    if let Some(n) = shard.connections {
        println!(
            "    connections: {} of max_connections {} ({} shardq, {} shardq-user, all processes)",
            n.total, n.max, n.shardq, n.user
        );
    }
    if let Some(h) = &shard.horizon {
        println!("    xmin horizon: {}", horizon_line(h));
    }
    for owed in &shard.wakes_owed {
        let to = all
            .get(owed.to)
            .map_or("another shard", |s| s.shard.as_str());
        println!(
            "    wakes owed to parents on {to}: {} (oldest finished {:.1} s ago)",
            owed.pending, owed.oldest_s
        );
    }
    let counts = shard.counts.as_deref().unwrap_or_default();
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

/// How long the oldest transaction has held the horizon, and by whom.
fn held_for(h: &Horizon) -> String {
    let oldest = h
        .held
        .iter()
        .filter_map(|held| Some((held.holder, held.seconds?)))
        .filter(|(_, s)| *s > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let Some((holder, seconds)) = oldest else {
        return "no transaction holds the xmin horizon".to_string();
    };
    let by = match (holder, h.oldest_backend_pid) {
        (Holder::Backend, Some(pid)) => format!("session pid {pid}"),
        (other, _) => other.as_str().replace('_', " "),
    };
    format!("a transaction has held the xmin horizon for {seconds:.1} s ({by})")
}

/// The horizon, its other holders and the queue table's dead versions.
fn horizon_line(h: &Horizon) -> String {
    let mut parts = vec![held_for(h)];
    for holder in [Holder::Standby, Holder::ReplicationSlot] {
        if let Some(held) = h.held_by(holder).filter(|held| held.xids > 0) {
            parts.push(format!("{} {} xids behind", holder.as_str(), held.xids));
        }
    }
    if h.hidden_sessions > 0 {
        parts.push(format!(
            "{} sessions hidden from this role (grant pg_read_all_stats)",
            h.hidden_sessions
        ));
    }
    if let Some(t) = &h.queue_table {
        let vacuumed = t
            .last_autovacuum_s
            .map_or_else(|| "never".to_string(), |s| format!("{s:.0} s ago"));
        parts.push(format!(
            "~{} dead row versions in the queue table, last autovacuum {vacuumed}",
            t.dead_rows
        ));
    }
    if let Some(age) = h.lease_floor_age_s {
        parts.push(format!("lease floor {age:.0} s old"));
    }
    parts.join("; ")
}

/// The schedules that live on one shard, one line each.
fn print_schedules(schedules: &[ScheduleStatus]) {
    let or_none = |t: &Option<String>| t.clone().unwrap_or_else(|| "none".into());
    for s in schedules {
        println!(
            "schedule {} ({} {}, queue {}, missed: {}): last tick {}, next tick {}{}",
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
