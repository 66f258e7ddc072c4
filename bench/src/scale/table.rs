//! The summary on stdout: the runs, the disturbance runs shard by shard, and
//! the expected outcomes with what was measured.

use super::claims::Claim;
use super::output::Report;
use super::plan::Load;
use super::result::RunResult;

/// Prints everything.
pub fn print(report: &Report) {
    let m = &report.machine;
    let server = report.servers.first();
    println!();
    println!(
        "shardq bench scale: {} cores, {:.1} GiB, load {} → {}; PostgreSQL {} (shared_buffers {}, synchronous_commit {}, fsync {}, max_connections {}); {}",
        m.cores,
        m.mem_total_mib / 1024.0,
        m.loadavg_start,
        m.loadavg_end,
        server.map_or("?", |s| s.version.as_str()),
        server.map_or("?", |s| s.shared_buffers.as_str()),
        server.map_or("?", |s| s.synchronous_commit.as_str()),
        server.map_or("?", |s| s.fsync.as_str()),
        server.map_or("?", |s| s.max_connections.as_str()),
        report.settings.shards_source,
    );
    println!(
        "K = {} slots{}, batch {}; disturbance runs: {}; dequeuers/shard = W processes × P producers",
        report.settings.slots,
        if report.settings.adaptive_slots { " to start (adaptive, 1..=8)" } else { " (fixed)" },
        report.settings.batch,
        if report.settings.worker_defaults {
            "the library's lock wait, statement deadline and failing-shard backoff".to_string()
        } else {
            format!(
                "lock_timeout {} ms, statements 1 s, unhealthy backoff ≤ {} ms",
                report.settings.lock_timeout_ms, report.settings.unhealthy_backoff_max_ms
            )
        }
    );
    let buffer = report
        .settings
        .buffer_jobs
        .map_or("the bench's default".to_string(), |b| b.to_string());
    println!(
        "worker.buffer_jobs {buffer}; jobs: {}",
        match report.settings.job_ms {
            0 => "noop".to_string(),
            ms => format!("sleep {ms} ms"),
        }
    );
    println!();
    println!(
        "{:>3} {:<12} {:<8} {:>6} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>6} {:>5}  check",
        "#", "kind", "mode", "shards", "W×P", "jobs", "jobs/s", "p50 ms", "p95 ms", "p99 ms", "p99.9", "max ms", "stmt p99", "miss%", "cpu%"
    );
    for r in &report.runs {
        print_run(r);
    }
    for r in report.runs.iter().filter(|r| r.disturbance.is_some()) {
        print_disturbance(r);
    }
    print_stalls(&report.runs);
    println!();
    println!("expected outcomes:");
    for c in &report.claims {
        print_claim(c);
    }
}

fn print_run(r: &RunResult) {
    let stmt_p99 = r
        .claim_statement_ms
        .iter()
        .map(|p| p.p99)
        .fold(0.0, f64::max);
    let wp = format!(
        "{}×{}={}",
        r.processes, r.producers_per_process, r.dequeuers_per_shard
    );
    let kind = match r.load {
        Load::Drain { .. } => format!("{}/drain", r.kind),
        Load::Rate { .. } => format!("{}/rate", r.kind),
    };
    let l = &r.claim_latency_ms;
    println!(
        "{:>3} {:<12} {:<8} {:>6} {:>9} {:>9} {:>9.0} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>9.2} {:>6.1} {:>5.0}  {}",
        r.id,
        kind.replace("disturbance", "dist"),
        r.mode.name(),
        r.shards,
        wp,
        r.jobs,
        r.jobs_per_s,
        l.p50,
        l.p95,
        l.p99,
        l.p999,
        l.max,
        stmt_p99,
        r.lock_miss_rate * 100.0,
        r.cpu_busy * 100.0,
        if r.ok { "ok".to_string() } else { format!("FAILED: {}", r.error.as_deref().unwrap_or("?")) }
    );
}

fn print_disturbance(r: &RunResult) {
    let Some(d) = &r.disturbance else { return };
    println!();
    println!(
        "run {} ({}): {:?} on shard {} from {:.2} to {:.2} s (planned at {} s for {} s); jobs/s by shard:",
        r.id,
        r.mode.name(),
        d.plan.kind,
        d.plan.shard,
        d.window.start_s,
        d.window.end_s,
        d.plan.at_s,
        d.plan.for_s
    );
    println!(
        "  {:>5} {:>9} {:>9} {:>9} {:>7}",
        "shard", "before", "during", "after", "kept"
    );
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |k| format!("{:.0}%", k * 100.0));
    for i in 0..d.before_jobs_per_s.len() {
        println!(
            "  {:>5} {:>9.0} {:>9.0} {:>9.0} {:>7}",
            i,
            d.before_jobs_per_s[i],
            d.during_jobs_per_s[i],
            d.after_jobs_per_s[i],
            pct(d.kept_by_shard.get(i).copied().flatten())
        );
    }
    let secs = |v: Option<f64>| v.map_or("never".to_string(), |s| format!("{s:.2} s"));
    println!(
        "  undisturbed shards together kept {} of their rate (each ≥ {:.0}%); disturbed shard claimed from again {} after the end, recovered (completions) after {}, (claims) after {}",
        pct(d.healthy_kept),
        d.others_kept * 100.0,
        secs(d.reclaimed_s),
        secs(d.recovery_s),
        secs(d.recovery_claims_s)
    );
    if let Some(n) = d.fault_statements {
        println!(
            "  statements sent to the disturbed shard during the fault (through its proxy): {n}"
        );
    }
}

/// The first snapshot of each run's stalls, most common activity first.
fn print_stalls(runs: &[RunResult]) {
    let stalled: Vec<&RunResult> = runs.iter().filter(|r| !r.stalls.is_empty()).collect();
    if stalled.is_empty() {
        return;
    }
    println!();
    println!("stalls (a shard with claimed jobs outstanding wrote no outcome for 2 s; see `stalls` in the JSON):");
    for r in stalled {
        for st in &r.stalls {
            let top = st
                .activity
                .first()
                .map_or("nothing active".to_string(), |a| {
                    format!(
                        "{}× {} {}/{} `{}`{}",
                        a.backends,
                        a.state,
                        a.wait_event_type,
                        a.wait_event,
                        a.query,
                        if a.blocked_by.is_empty() {
                            String::new()
                        } else {
                            format!(" blocked by `{}`", a.blocked_by)
                        }
                    )
                });
            println!(
                "  run {} ({}), shard {} at {:.1} s, {} outstanding: {top}",
                r.id,
                r.mode.name(),
                st.shard,
                st.at_s,
                st.outstanding
            );
        }
    }
}

fn print_claim(c: &Claim) {
    let tag = match c.held {
        Some(true) => "HELD",
        Some(false) => "NOT HELD",
        None => "INFO",
    };
    println!("  [{tag}] {}: {}", c.name, c.expected);
    println!("         measured: {}", c.measured);
}
