//! `shardq check`: every shard's invariants, a report, and an exit code a
//! script or CI can act on.

use crate::args::CheckArgs;
use anyhow::{bail, Result};
use shardq::client::{CheckOptions, CheckReport, Finding, ShardCheck};
use shardq::config::Config;
use shardq::Client;
use std::time::Duration;

/// Exit code when an invariant is broken on a shard that answered.
pub const EXIT_BROKEN: u8 = 3;

/// Exit code when nothing is broken but a shard did not answer (so the
/// answer is unknown there).
pub const EXIT_UNANSWERED: u8 = 4;

/// How the check ended when it did not end well: `main` exits with
/// `code`, after printing this as the last line.
#[derive(Debug)]
pub struct Verdict {
    /// The process exit code.
    pub code: u8,
    /// One line.
    pub summary: String,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.summary)
    }
}

impl std::error::Error for Verdict {}

pub async fn run(config: &Config, args: CheckArgs) -> Result<()> {
    if args.shard_timeout_ms == 0 {
        bail!("--shard-timeout-ms must be at least 1");
    }
    let mut options = CheckOptions {
        deadline: Duration::from_millis(args.shard_timeout_ms),
        state_rows: args.state_rows,
        key_entries: args.key_entries,
        examples: args.examples,
        wait_entries: args.wait_entries,
        child_grace: Duration::from_millis(args.child_grace_ms),
        ..CheckOptions::from_config(config)
    };
    if let Some(ms) = args.stale_after_ms {
        options.stale_after = Duration::from_millis(ms);
    }
    let report = Client::new(config)?.check(&options).await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    verdict(&report)
}

/// 0 / [`EXIT_BROKEN`] / [`EXIT_UNANSWERED`], with a one-line summary.
fn verdict(report: &CheckReport) -> Result<()> {
    let broken = report.violations();
    let unanswered = report.unanswered().len();
    let silent = if unanswered > 0 {
        format!("; {unanswered} shard(s) did not answer")
    } else {
        String::new()
    };
    if broken > 0 {
        let names: Vec<&str> = report
            .broken_invariants()
            .iter()
            .map(|i| i.as_str())
            .collect();
        return Err(Verdict {
            code: EXIT_BROKEN,
            summary: format!(
                "invariants broken: {broken} instance(s) of {}{silent}",
                names.join(", ")
            ),
        }
        .into());
    }
    if unanswered > 0 {
        return Err(Verdict {
            code: EXIT_UNANSWERED,
            summary: format!(
                "no invariant broken on the shards that answered{silent}: their state is unknown"
            ),
        }
        .into());
    }
    Ok(())
}

fn print_report(report: &CheckReport) {
    println!(
        "stale after {:.1} s (a lease expired or a job due longer ago is a violation)",
        report.stale_after_ms as f64 / 1000.0
    );
    for shard in &report.shards {
        print_shard(shard);
    }
    let broken = report.violations();
    if broken == 0 && report.unanswered().is_empty() {
        println!("invariants: all hold on {} shard(s)", report.shards.len());
    }
}

fn print_shard(shard: &ShardCheck) {
    if let Some(error) = &shard.error {
        println!("{}: did not answer: {error}", shard.shard);
        return;
    }
    let broken = shard.violations();
    let state = if broken == 0 {
        "all hold".to_string()
    } else {
        format!("{broken} broken")
    };
    println!("{}: {state} (read in {} ms)", shard.shard, shard.took_ms);
    for finding in &shard.findings {
        print_finding(finding);
    }
}

fn print_finding(f: &Finding) {
    let count = if f.capped && f.broken > 0 {
        format!("≥{}", f.broken)
    } else {
        f.broken.to_string()
    };
    let bounded = if f.capped {
        " [bounded read: rows past the bound were not judged]"
    } else {
        ""
    };
    println!(
        "    {:<23} {:>8}  {}{bounded}",
        f.invariant.as_str(),
        count,
        f.invariant.describe()
    );
    for e in &f.examples {
        let job = e.job.map(|j| j.to_string()).unwrap_or_default();
        let queue = e
            .queue
            .as_deref()
            .map(|q| format!(" queue {q}"))
            .unwrap_or_default();
        let key = e
            .ordering_key
            .as_deref()
            .map(|k| format!(" key {k}"))
            .unwrap_or_default();
        match e.job {
            Some(_) => println!("        {job}{queue}{key}: {}", e.detail),
            None => println!("        {}", e.detail),
        }
    }
}
