//! `shardq-bench workflows`: what workflows cost on local shards, with one
//! worker in this process (its handlers are closures here, so a message's
//! arrival can be timed where it happens).
//!
//! Parts (`--only`), each on fresh servers, [`servers`]:
//! - [`throughput`]: no-op workflows of 0, 1 and 3 steps on 1 and 2 shards:
//!   workflows/s, and per workflow the database's CPU, commits and
//!   statements ([`meter`]);
//! - [`messages`]: send → recv latency to workflows parked in a `recv`;
//! - [`children`]: a parent gathering its children, enqueue to success.
//!
//! Durable sleep at scale is `shardq-bench sleepers`.

mod args;
mod children;
mod messages;
mod meter;
mod report;
mod servers;
mod throughput;

pub use args::WorkflowsArgs;

use crate::procfs;
use anyhow::{bail, Result};
use args::Part;
use report::Report;
use servers::BenchShards;

/// Runs the parts asked for, prints the tables, writes the JSON.
pub async fn run(args: WorkflowsArgs) -> Result<()> {
    let args = args.quick_sizes();
    if args.workflows == 0 || args.messages == 0 || args.children == 0 || args.gathers == 0 {
        bail!("--workflows, --messages, --children and --gathers must be at least 1");
    }
    if args.rate == 0 || args.shards.contains(&0) {
        bail!("--rate and each of --shards must be at least 1");
    }
    let mut report = Report {
        cpus: procfs::cpus(),
        loadavg_at_start: procfs::loadavg(),
        postgres: String::new(),
        throughput: Vec::new(),
        messages: None,
        children: None,
    };
    if args.only.contains(&Part::Throughput) {
        for &n in &args.shards {
            let shards = BenchShards::start(n).await?;
            report.postgres = shards.version().to_string();
            for &steps in &args.steps {
                eprintln!(
                    "throughput: {} workflows of {steps} steps on {n} shard(s)",
                    args.workflows
                );
                let run = throughput::run(&shards, args.workflows, steps).await?;
                eprintln!("  {:.0} workflows/s", run.workflows_per_s);
                report.throughput.push(run);
            }
        }
    }
    if args.only.contains(&Part::Messages) || args.only.contains(&Part::Children) {
        let shards = BenchShards::start(1).await?;
        report.postgres = shards.version().to_string();
        if args.only.contains(&Part::Messages) {
            eprintln!("messages: {} at {}/s", args.messages, args.rate);
            report.messages = Some(messages::run(&shards, args.messages, args.rate).await?);
        }
        if args.only.contains(&Part::Children) {
            let child_work = std::time::Duration::from_millis(args.child_work_ms);
            eprintln!(
                "children: {} parents of {} children",
                args.gathers, args.children
            );
            report.children =
                Some(children::run(&shards, args.children, child_work, args.gathers).await?);
        }
    }
    report.print();
    report.write(&args.out)?;
    println!("results written to {}", args.out.display());
    Ok(())
}
