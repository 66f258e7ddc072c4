//! What `shardq-bench workflows` measured: one record per run, printed as
//! tables and written as JSON.

use super::meter::PerUnit;
use anyhow::Result;
use serde::Serialize;
use std::path::Path;

/// One throughput run: `workflows` no-op workflows of `steps` steps,
/// enqueued first, then drained by one worker.
#[derive(Debug, Serialize)]
pub struct ThroughputRun {
    /// Shards (each its own server).
    pub shards: usize,
    /// Steps per workflow.
    pub steps: usize,
    /// Workflows drained.
    pub workflows: usize,
    /// From the worker's start to the last workflow's success, s.
    pub took_s: f64,
    /// Workflows per second over that time.
    pub workflows_per_s: f64,
    /// Costs per workflow of the drain (the enqueue not included).
    pub per_workflow: PerUnit,
}

/// Messages sent to workflows parked in a `recv`, one each.
#[derive(Debug, Serialize)]
pub struct MessagesRun {
    /// Messages (and workflows).
    pub messages: usize,
    /// Sends per second.
    pub rate: u32,
    /// From the `client.send` call's start to the handler's `recv`
    /// returning the message, ms.
    pub latency_ms: Percentiles,
    /// The `client.send` call alone, ms.
    pub send_ms: Percentiles,
    /// Costs per message, from the first send to the last workflow's
    /// success: the send, the wake, the claim, the replayed run, the recv,
    /// the completion.
    pub per_message: PerUnit,
}

/// Sends between workflows (`ctx.send`), to a recipient on the sender's
/// shard or on another.
#[derive(Debug, Serialize)]
pub struct SendsRun {
    /// Messages (and senders, and recipients).
    pub messages: usize,
    /// Senders enqueued per second.
    pub rate: u32,
    /// Whether the senders lived on another shard than their recipients.
    pub between_shards: bool,
    /// From just before the sender's `ctx.send` to the recipient's `recv`
    /// returning the message, ms.
    pub latency_ms: Percentiles,
    /// Costs per message, from the first sender's enqueue to the last
    /// success: the sender's whole run (claim, send, step record,
    /// completion) and the recipient's wake, run and completion.
    pub per_message: PerUnit,
}

/// Sends to two destinations while one is frozen ([`super::frozen_sends`]).
#[derive(Debug, Serialize)]
pub struct FrozenSendsRun {
    /// Senders enqueued per second (half to each destination).
    pub rate: u32,
    /// The worker's buffer of 200 jobs and claims of 50, not the defaults.
    pub small_buffers: bool,
    /// Sends before the freeze, s.
    pub baseline_s: u64,
    /// How long the frozen destination was frozen.
    pub freeze_s: u64,
    /// Messages arriving per second on the healthy destination before the
    /// freeze.
    pub healthy_before_per_s: f64,
    /// The same during the freeze.
    pub healthy_frozen_per_s: f64,
    /// During over before (goal ≥ 0.9).
    pub healthy_ratio: f64,
    /// The healthy destination's fewest arrivals in one second of the
    /// freeze.
    pub healthy_fewest_in_a_second: u32,
    /// From the thaw to the arrival of the last message to the frozen
    /// destination whose sender was enqueued before the thaw.
    pub backlog_delivered_s: f64,
    /// Per second from the first send: arrivals on (healthy, frozen).
    pub per_second: Vec<(u32, u32)>,
}

/// A parent that starts its children and gathers their results.
#[derive(Debug, Serialize)]
pub struct ChildrenRun {
    /// Shards the run had.
    pub shards: usize,
    /// Whether each child had a key of its own (spread over the shards).
    pub keyed: bool,
    /// Children per parent.
    pub children: usize,
    /// How long each child's handler waited before it succeeded, ms.
    pub child_work_ms: u64,
    /// Each parent, in order.
    pub gathers: Vec<Gather>,
    /// The median of `gathers[].shard_ms`.
    pub median_shard_ms: f64,
    /// The median of `gathers[].wall_ms`.
    pub median_wall_ms: f64,
    /// Costs per gather (a parent with all its children).
    pub per_gather: PerUnit,
}

/// One parent's gather.
#[derive(Debug, Serialize)]
pub struct Gather {
    /// From the parent's row insert (`created_at`) to its success
    /// (`finished_at`), by the shard's clock, ms.
    pub shard_ms: f64,
    /// From before the bench's `enqueue` call to its poll (every 20 ms)
    /// seeing the success, ms.
    pub wall_ms: f64,
    /// Times the parent's handler ran (it parks on each unfinished child).
    pub parent_runs: u64,
}

/// p50, p99 and max of a sample.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// Of `values` (any order; an empty sample gives zeros).
    pub fn of(mut values: Vec<f64>) -> Percentiles {
        values.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let i = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len().max(1));
            values.get(i - 1).copied().unwrap_or(0.0)
        };
        Percentiles {
            p50: rank(0.5),
            p99: rank(0.99),
            max: values.last().copied().unwrap_or(0.0),
        }
    }
}

/// Everything one invocation measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Cores of the machine (the servers, the worker and the bench share them).
    pub cpus: usize,
    /// `/proc/loadavg` at the start.
    pub loadavg_at_start: String,
    /// The servers' PostgreSQL version.
    pub postgres: String,
    /// Throughput runs.
    pub throughput: Vec<ThroughputRun>,
    /// The messages run, when asked.
    pub messages: Option<MessagesRun>,
    /// The sends runs (same shard, another shard), when asked.
    pub sends: Vec<SendsRun>,
    /// The sends through a frozen destination, when asked.
    pub frozen_sends: Option<FrozenSendsRun>,
    /// The children runs, when asked.
    pub children: Vec<ChildrenRun>,
}

impl Report {
    /// Writes the JSON to `out`, creating its folder.
    pub fn write(&self, out: &Path) -> Result<()> {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(out, serde_json::to_string_pretty(self)?)?;
        Ok(())
    }

    /// Prints the tables.
    pub fn print(&self) {
        println!(
            "shardq bench workflows: {} cores shared by the servers, the worker and the bench; PostgreSQL {}; load at start {}",
            self.cpus, self.postgres, self.loadavg_at_start
        );
        if !self.throughput.is_empty() {
            println!();
            println!(
                "throughput: no-op workflows enqueued first, then drained by one worker (in this process, default settings); \
                 costs per workflow of the drain"
            );
            println!(
                "  {:>6} {:>5} {:>9} {:>8} {:>12} {:>11} {:>9} {:>15}",
                "shards",
                "steps",
                "workflows",
                "took s",
                "workflows/s",
                "db CPU µs",
                "worker µs",
                "commits / stmts"
            );
            for r in &self.throughput {
                println!(
                    "  {:>6} {:>5} {:>9} {:>8.2} {:>12.0} {:>11.1} {:>9.1} {:>15}",
                    r.shards,
                    r.steps,
                    r.workflows,
                    r.took_s,
                    r.workflows_per_s,
                    r.per_workflow.database_cpu_us,
                    r.per_workflow.worker_cpu_us,
                    counts(&r.per_workflow),
                );
            }
            println!("  (per workflow: the servers' CPU, this process's CPU, transactions committed / top-level statements)");
        }
        if let Some(m) = &self.messages {
            println!();
            println!(
                "send → recv: {} workflows parked in ctx.recv on one shard, one client.send each at {}/s; \
                 latency from the send call's start to the handler's recv returning the message",
                m.messages, m.rate
            );
            println!(
                "  latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; the send call alone p50 {:.1} ms, p99 {:.1} ms",
                m.latency_ms.p50, m.latency_ms.p99, m.latency_ms.max, m.send_ms.p50, m.send_ms.p99
            );
            println!(
                "  per message: database CPU {:.1} µs, worker CPU {:.1} µs, commits / statements {}",
                m.per_message.database_cpu_us,
                m.per_message.worker_cpu_us,
                counts(&m.per_message)
            );
        }
        for r in &self.sends {
            println!();
            println!(
                "ctx.send → recv, {}: {} workflows parked in ctx.recv on shard 1, one sender workflow each \
                 enqueued at {}/s; latency from just before the sender's ctx.send to the recipient's recv \
                 returning the message",
                if r.between_shards { "senders on shard 0 (another shard)" } else { "senders on shard 1 (the same shard)" },
                r.messages,
                r.rate
            );
            println!(
                "  latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                r.latency_ms.p50, r.latency_ms.p99, r.latency_ms.max
            );
            println!(
                "  per message (sender's run included): database CPU {:.1} µs, worker CPU {:.1} µs, commits / statements {}",
                r.per_message.database_cpu_us,
                r.per_message.worker_cpu_us,
                counts(&r.per_message)
            );
        }
        if let Some(f) = &self.frozen_sends {
            println!();
            println!(
                "ctx.send through a frozen destination: sender workflows on shard 0 enqueued at {}/s, \
                 half to workflows parked in ctx.recv on shard 1, half on shard 2; shard 2 frozen for {} s \
                 after {} s ({})",
                f.rate,
                f.freeze_s,
                f.baseline_s,
                if f.small_buffers { "a buffer of 200 jobs, claims of 50" } else { "default worker settings" }
            );
            println!(
                "  shard 1's arrivals: {:.1}/s before, {:.1}/s during the freeze ({:.0} %), \
                 fewest in a second of it {}; shard 2's backlog delivered {:.1} s after the thaw",
                f.healthy_before_per_s,
                f.healthy_frozen_per_s,
                f.healthy_ratio * 100.0,
                f.healthy_fewest_in_a_second,
                f.backlog_delivered_s
            );
            let line: Vec<String> = f
                .per_second
                .iter()
                .map(|(h, c)| format!("{h}/{c}"))
                .collect();
            println!("  per second (shard 1 / shard 2): {}", line.join(" "));
        }
        for c in &self.children {
            println!();
            println!(
                "children on {} shard(s){}: a parent starts {} children (ctx.start_child; each waits {} ms, \
                 then succeeds), then awaits each result(); parents one after the other",
                c.shards,
                if c.keyed { ", each keyed (spread over the shards)" } else { "" },
                c.children,
                c.child_work_ms
            );
            println!(
                "  {:>6} {:>12} {:>10} {:>11}",
                "parent", "shard ms", "wall ms", "parent runs"
            );
            for (i, g) in c.gathers.iter().enumerate() {
                println!(
                    "  {:>6} {:>12.1} {:>10.1} {:>11}",
                    i + 1,
                    g.shard_ms,
                    g.wall_ms,
                    g.parent_runs
                );
            }
            println!(
                "  median {:.1} ms by the shard's clock (enqueue to success), {:.1} ms by the bench's",
                c.median_shard_ms, c.median_wall_ms
            );
            println!(
                "  per gather: database CPU {:.1} ms, worker CPU {:.1} ms, commits / statements {}",
                c.per_gather.database_cpu_us / 1000.0,
                c.per_gather.worker_cpu_us / 1000.0,
                counts(&c.per_gather)
            );
        }
    }
}

/// Commits / statements, as the tables show them.
fn counts(cost: &PerUnit) -> String {
    match cost.statements {
        Some(s) => format!("{:.2} / {s:.2}", cost.commits),
        None => format!("{:.2} / -", cost.commits),
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}
