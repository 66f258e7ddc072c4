//! The horizon benchmark's results: a line per interval as it goes, a table
//! per scenario, the goals judged (the held run against the one without),
//! and the JSON file.

use super::args::HorizonArgs;
use anyhow::Result;
use serde::Serialize;

/// One interval on one shard.
#[derive(Debug, Clone, Serialize)]
pub struct ShardInterval {
    pub offered_per_s: f64,
    pub completed_per_s: f64,
    pub pickup_p50_ms: Option<f64>,
    pub pickup_p99_ms: Option<f64>,
    /// Sampled jobs read, and how many of them were not claimed yet.
    pub sampled: usize,
    pub waiting: usize,
    /// Mean claim statement time, from the worker's heartbeat.
    pub claim_ms: Option<f64>,
    pub dead_versions: i64,
    pub oldest_xact_s: f64,
}

/// One interval, every shard.
#[derive(Debug, Clone, Serialize)]
pub struct Interval {
    /// Seconds since the offer began, at the interval's end.
    pub at_s: f64,
    /// `warm-up`, `held` (or `steady` without the snapshot), `after`.
    pub phase: &'static str,
    pub shards: Vec<ShardInterval>,
}

/// One run.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    /// Whether the snapshot was held.
    pub held: bool,
    pub offered_total: u64,
    pub intervals: Vec<Interval>,
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"))
}

impl Interval {
    /// The progress line: shard 0's figures, and the others' completion share.
    pub fn line(&self) -> String {
        let s0 = &self.shards[0];
        let others: f64 = self.shards[1..].iter().map(|s| s.completed_per_s).sum();
        let others_offered: f64 = self.shards[1..].iter().map(|s| s.offered_per_s).sum();
        let rest = if self.shards.len() > 1 {
            format!("; other shards {:.0}/{:.0} jobs/s", others, others_offered)
        } else {
            String::new()
        };
        format!(
            "{:>5.0} s {:<8} s0: offered {:>6.0}/s completed {:>6.0}/s pickup p50 {:>6} p99 {:>6} ms \
             (waiting {}), claim {} ms, dead {}, oldest xact {:.0} s{rest}",
            self.at_s,
            self.phase,
            s0.offered_per_s,
            s0.completed_per_s,
            ms(s0.pickup_p50_ms),
            ms(s0.pickup_p99_ms),
            s0.waiting,
            s0.claim_ms.map_or_else(|| "-".into(), |v| format!("{v:.1}")),
            s0.dead_versions,
            s0.oldest_xact_s,
        )
    }
}

/// Prints each scenario's table, then the goals judged.
pub fn print(args: &HorizonArgs, scenarios: &[Scenario]) {
    for scenario in scenarios {
        println!(
            "\n{} ({} shard(s), {} jobs/s offered over {}, {} offered in all)",
            if scenario.held {
                "snapshot held on s0"
            } else {
                "no snapshot"
            },
            args.shards,
            args.rate,
            args.spread(),
            scenario.offered_total
        );
        println!(
            "{:>6} {:<8} {:>5} {:>9} {:>9} {:>6} {:>8} {:>8} {:>8} {:>10} {:>9}",
            "at s",
            "phase",
            "shard",
            "offered/s",
            "done/s",
            "done %",
            "p50 ms",
            "p99 ms",
            "claim ms",
            "dead",
            "oldest s"
        );
        for interval in &scenario.intervals {
            for (i, s) in interval.shards.iter().enumerate() {
                println!(
                    "{:>6.0} {:<8} {:>5} {:>9.0} {:>9.0} {:>6.1} {:>8} {:>8} {:>8} {:>10} {:>9.0}",
                    interval.at_s,
                    interval.phase,
                    format!("s{i}"),
                    s.offered_per_s,
                    s.completed_per_s,
                    100.0 * s.completed_per_s / s.offered_per_s.max(1e-9),
                    ms(s.pickup_p50_ms),
                    ms(s.pickup_p99_ms),
                    s.claim_ms.map_or_else(|| "-".into(), |v| format!("{v:.1}")),
                    s.dead_versions,
                    s.oldest_xact_s
                );
            }
        }
    }
    if let [without, with] = scenarios {
        judge(without, with);
    }
}

/// The goals, on shard 0 (where the snapshot is held): the worker
/// keeps up (≥ 95 % of the offer) in every interval while it is held, its
/// pickup p99 stays within 2× the median p99 without it, and the interval
/// after the release is back to the offer.
fn judge(without: &Scenario, with: &Scenario) {
    let p99s: Vec<f64> = without
        .intervals
        .iter()
        .filter(|i| i.phase == "steady")
        .filter_map(|i| i.shards[0].pickup_p99_ms)
        .collect();
    let baseline = median(p99s);
    let held: Vec<&Interval> = with
        .intervals
        .iter()
        .filter(|i| i.phase == "held")
        .collect();
    let worst_share = held
        .iter()
        .map(|i| i.shards[0].completed_per_s / i.shards[0].offered_per_s.max(1e-9))
        .fold(f64::INFINITY, f64::min);
    let worst_p99 = held
        .iter()
        .filter_map(|i| i.shards[0].pickup_p99_ms)
        .fold(0.0, f64::max);
    println!("\ngoals on s0 while the snapshot is held:");
    println!(
        "  worst interval completed {:.1} % of the offer (goal ≥ 95 %)",
        100.0 * worst_share
    );
    println!(
        "  worst pickup p99 {worst_p99:.0} ms against {} ms without the snapshot (goal ≤ 2×)",
        ms(baseline)
    );
    if let Some(after) = with.intervals.iter().find(|i| i.phase == "after") {
        let s0 = &after.shards[0];
        println!(
            "  first interval after the release: completed {:.1} % of the offer, pickup p99 {} ms",
            100.0 * s0.completed_per_s / s0.offered_per_s.max(1e-9),
            ms(s0.pickup_p99_ms)
        );
    }
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

/// Writes the settings and every scenario as JSON.
pub fn write(args: &HorizonArgs, scenarios: &[Scenario]) -> Result<()> {
    #[derive(Serialize)]
    struct File<'a> {
        shards: usize,
        rate: u64,
        keys: u64,
        groups: u64,
        warmup_s: u64,
        hold_s: u64,
        after_s: u64,
        interval_s: u64,
        cpus: usize,
        scenarios: &'a [Scenario],
    }
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = File {
        shards: args.shards,
        rate: args.rate,
        keys: args.keys,
        groups: args.groups,
        warmup_s: args.warmup_s,
        hold_s: args.hold_s,
        after_s: args.after_s,
        interval_s: args.interval_s,
        cpus: crate::procfs::cpus(),
        scenarios,
    };
    std::fs::write(&args.out, serde_json::to_string_pretty(&file)?)?;
    Ok(())
}
