//! `shardq-bench workflows`: what workflows cost on local shards, with one
//! worker in this process (its handlers are closures here, so a message's
//! arrival can be timed where it happens).
//!
//! Parts (`--only`), each on fresh servers, [`servers`]:
//! - [`throughput`]: no-op workflows of 0, 1 and 3 steps on 1 and 2 shards:
//!   workflows/s, and per workflow the database's CPU, commits and
//!   statements ([`meter`]);
//! - [`messages`]: send → recv latency to workflows parked in a `recv`;
//! - [`children`]: a parent gathering its children, enqueue to success;
//! - [`sends`]: `ctx.send` on one shard and between two;
//! - [`frozen_sends`]: `ctx.send` to two destinations while one is frozen.
//!
//! Durable sleep at scale is `shardq-bench sleepers`.

mod args;
mod children;
mod frozen_sends;
mod messages;
mod meter;
mod report;
mod sends;
mod servers;
mod throughput;

pub use args::WorkflowsArgs;

use crate::pipeline::statements;
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
        sends: Vec::new(),
        children: Vec::new(),
        frozen_sends: None,
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
                let what = format!(
                    "{} workflows of {steps} steps, per workflow",
                    args.workflows
                );
                let part = throughput::run(&shards, args.workflows, steps);
                let units = args.workflows as u64;
                let run = profiled(&shards, args.statements, &what, units, part).await?;
                eprintln!("  {:.0} workflows/s", run.workflows_per_s);
                report.throughput.push(run);
            }
        }
    }
    if args.only.contains(&Part::Messages) {
        let shards = BenchShards::start(1).await?;
        report.postgres = shards.version().to_string();
        eprintln!("messages: {} at {}/s", args.messages, args.rate);
        let what = format!("{} messages, per message", args.messages);
        let part = messages::run(&shards, args.messages, args.rate);
        let units = args.messages as u64;
        report.messages = Some(profiled(&shards, args.statements, &what, units, part).await?);
    }
    if args.only.contains(&Part::Sends) {
        let shards = BenchShards::start(2).await?;
        report.postgres = shards.version().to_string();
        // Alternating, so that both see the same machine.
        for from in [1, 0, 1, 0] {
            eprintln!(
                "sends: {} at {}/s, senders on shard {from}, recipients on shard 1",
                args.messages, args.rate
            );
            let run = sends::run(&shards, args.messages, args.rate, from).await?;
            report.sends.push(run);
        }
    }
    if args.only.contains(&Part::FrozenSends) {
        let shards = BenchShards::start_with(3, args.small_buffers).await?;
        report.postgres = shards.version().to_string();
        eprintln!(
            "frozen sends: {}/s, shard 2 frozen for {} s, small buffers: {}",
            args.rate, args.freeze_s, args.small_buffers
        );
        let freeze = std::time::Duration::from_secs(args.freeze_s);
        let run = frozen_sends::run(&shards, args.rate, freeze, args.small_buffers);
        report.frozen_sends = Some(run.await?);
    }
    if args.only.contains(&Part::Children) {
        let gathering = children::Gathering {
            children: args.children,
            child_work: std::time::Duration::from_millis(args.child_work_ms),
            gathers: args.gathers,
            keyed: args.keyed_children || args.children_shards.iter().any(|&n| n > 1),
        };
        for &n in &args.children_shards {
            let shards = BenchShards::start(n).await?;
            report.postgres = shards.version().to_string();
            eprintln!(
                "children: {} parents of {} children on {n} shard(s)",
                args.gathers, args.children
            );
            let what = format!(
                "{} parents of {} children, per parent",
                args.gathers, args.children
            );
            let part = children::run(&shards, gathering);
            let units = args.gathers as u64;
            report
                .children
                .push(profiled(&shards, args.statements, &what, units, part).await?);
        }
    }
    report.print();
    report.write(&args.out)?;
    println!("results written to {}", args.out.display());
    Ok(())
}

/// Runs `part`; with `on`, on one shard, profiles it statement by statement
/// and prints where its database time went, per unit (`what`).
async fn profiled<T>(
    shards: &BenchShards,
    on: bool,
    what: &str,
    units: u64,
    part: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let on = on && shards.len() == 1;
    let shard = shards.observer().get(0);
    if on {
        statements::start(shard).await?;
    }
    let run = part.await?;
    if on {
        let costs = statements::finish(shard, units).await?;
        statements::print(&costs, what);
    }
    Ok(run)
}
