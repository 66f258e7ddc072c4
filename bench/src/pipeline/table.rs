//! The report as text tables.

use super::ceiling::{Statements, BATCH};
use super::pgcpu::PgCpu;
use super::report::{Report, GOAL_OVER_CEILING, GOAL_OVER_SERIAL, GOAL_PEAK_RSS_MIB};

/// Above this many cores used by other processes, a run is flagged as disturbed.
const NOISE_CORES: f64 = 0.1;

/// Microseconds per second.
const US_PER_S: f64 = 1e6;

/// Prints the tables on stdout.
pub fn print(r: &Report) {
    let m = &r.machine;
    println!();
    println!(
        "shardq bench pipeline: 1 shard, PostgreSQL {}",
        r.postgres_version
    );
    println!(
        "machine: {} cores (nproc), {:.1} GiB memory; {}",
        m.cpus,
        m.mem_total_mib / 1024.0,
        m.note
    );
    println!("load average at start: {}", m.loadavg_at_start);
    if let Some(fillfactor) = r.settings.table_fillfactor {
        println!("job table fillfactor: {fillfactor} (set by --table-fillfactor)");
    }
    if !r.settings.worker_env.is_empty() {
        println!("worker environment: {:?}", r.settings.worker_env);
    }
    print_ceiling(r);
    print_workers(r);
    print_time(r);
    print_summary(r);
}

/// The ceiling runs and the best one.
pub fn print_ceiling(r: &Report) {
    println!();
    println!(
        "statement ceiling: claim {BATCH} + complete {BATCH} per round trip pair, ungated, \
         no execution; the client is this process"
    );
    println!(
        "  {:>9} {:>10} {:>12} {:>8} {:>13} {:>15} {:>9} {:>12}",
        "dequeuers",
        "jobs",
        "jobs/s",
        "wall s",
        "client CPU s",
        "postgres CPU s",
        "claim ms",
        "complete ms"
    );
    for run in &r.ceiling {
        println!(
            "  {:>9} {:>10} {:>12} {:>8.2} {:>13.2} {:>15.2} {:>9.1} {:>12.1}",
            run.dequeuers,
            thousands(run.jobs as f64),
            thousands(run.jobs_per_s),
            run.wall_s,
            run.client_cpu_s,
            run.postgres_cpu.total_s,
            run.claim_ms,
            run.complete_ms
        );
    }
    println!(
        "  ceiling: {} jobs/s (best, {} dequeuers)",
        thousands(r.summary.ceiling_jobs_per_s),
        r.summary.ceiling_dequeuers
    );
    for run in &r.minimal {
        println!(
            "  minimal ceiling (bare table, UPDATE … SKIP LOCKED RETURNING + DELETE), {} dequeuer(s): {} jobs/s, claim {:.1} ms, delete {:.1} ms",
            run.dequeuers,
            thousands(run.jobs_per_s),
            run.claim_ms,
            run.complete_ms
        );
    }
    println!(
        "  pipeline / minimal ceiling: {:.0}%",
        r.summary.pipeline_over_minimal * 100.0
    );
}

/// The worker-process runs.
pub fn print_workers(r: &Report) {
    println!();
    println!("worker processes (`shardq worker --until-empty`; serial: `shardq-bench serial-worker`), timed from spawn to exit");
    println!(
        "  {:<9} {:>10} {:>12} {:>8} {:>13} {:>15} {:>13}",
        "run", "jobs", "jobs/s", "wall s", "worker CPU s", "postgres CPU s", "peak RSS MiB"
    );
    for run in [&r.pipeline, &r.serial]
        .into_iter()
        .chain(r.memory.as_ref())
    {
        println!(
            "  {:<9} {:>10} {:>12} {:>8.2} {:>13.2} {:>15.2} {:>13.1}",
            run.label,
            thousands(run.jobs as f64),
            thousands(run.jobs_per_s),
            run.wall_s,
            run.worker_cpu_s,
            run.postgres_cpu.total_s,
            run.peak_rss_mib
        );
    }
}

/// Where the time goes: average cores busy over the wall time, split by
/// process, and CPU per job.
pub fn print_time(r: &Report) {
    println!();
    println!(
        "where the time goes: cores busy on average over the wall time (of {}); CPU per job",
        r.machine.cpus
    );
    println!(
        "  {:<12} {:>7} {:>9} {:>9} {:>11} {:>11} {:>6} {:>7} {:>6} {:>10} {:>12} {:>10}",
        "run",
        "client",
        "postgres",
        "backends",
        "autovacuum",
        "background",
        "other",
        "others",
        "idle",
        "client µs",
        "postgres µs",
        "WAL B/job"
    );
    let cores = r.machine.cpus as f64;
    for run in r.ceiling.iter().chain(&r.minimal) {
        let kind = match run.statements {
            Statements::Shardq => "ceiling",
            Statements::Minimal => "minimal",
        };
        let label = format!("{kind} D={}", run.dequeuers);
        let jobs = run.jobs as f64;
        let cpu = (run.client_cpu_s, &run.postgres_cpu, run.others_cpu_s);
        time_row(cores, &label, cpu, run.wall_s, jobs, run.wal_bytes);
    }
    for run in [&r.pipeline, &r.serial]
        .into_iter()
        .chain(r.memory.as_ref())
    {
        let jobs = run.succeeded.max(1) as f64;
        let cpu = (run.worker_cpu_s, &run.postgres_cpu, run.others_cpu_s);
        time_row(cores, &run.label, cpu, run.wall_s, jobs, run.wal_bytes);
    }
    println!(
        "  client = this bench process (ceiling) or the worker process; postgres = \
         backends (statements) + autovacuum + background (WAL writer, checkpointer, \
         bgwriter) + other (postmaster, unsampled); others = \
         every other process on the machine (noise: should be ~0)"
    );
}

/// CPU seconds of the client, the server (by role) and every other process.
type Cpu<'a> = (f64, &'a PgCpu, f64);

fn time_row(
    cores: f64,
    label: &str,
    (client_s, pg, others_s): Cpu,
    wall_s: f64,
    jobs: f64,
    wal_bytes: i64,
) {
    let busy = |s: f64| s / wall_s;
    println!(
        "  {:<12} {:>7.2} {:>9.2} {:>9.2} {:>11.2} {:>11.2} {:>6.2} {:>7.2} {:>6.2} {:>10.1} {:>12.1} {:>10.0}",
        label,
        busy(client_s),
        busy(pg.total_s),
        busy(pg.backends_s),
        busy(pg.autovacuum_s),
        busy(pg.background_s),
        busy(pg.other_s),
        busy(others_s),
        (cores - busy(client_s + pg.total_s + others_s)).max(0.0),
        client_s / jobs * US_PER_S,
        pg.total_s / jobs * US_PER_S,
        wal_bytes as f64 / jobs
    );
}

/// The goals, and a warning when other processes competed for the cores.
pub fn print_summary(r: &Report) {
    let s = &r.summary;
    if s.others_cores_max > NOISE_CORES {
        println!();
        println!(
            "  WARNING: other processes on this machine used up to {:.2} cores during a run; \
             the numbers are disturbed; rerun on a quiet machine",
            s.others_cores_max
        );
    }
    println!();
    println!(
        "  {:<28} {:>10}  {:<10} verdict",
        "summary", "measured", "goal"
    );
    println!(
        "  {:<28} {:>9.1}x  {:<10} {}",
        "pipeline / serial",
        s.pipeline_over_serial,
        format!(">= {GOAL_OVER_SERIAL}x"),
        s.verdict("pipeline_over_serial")
    );
    println!(
        "  {:<28} {:>9.0}%  {:<10} {}",
        "pipeline / ceiling",
        s.pipeline_over_ceiling * 100.0,
        format!(">= {:.0}%", GOAL_OVER_CEILING * 100.0),
        s.verdict("pipeline_over_ceiling")
    );
    println!(
        "  {:<28} {:>6.1} MiB  {:<10} {}",
        "worker peak RSS",
        s.peak_rss_mib,
        format!("< {GOAL_PEAK_RSS_MIB} MiB"),
        s.verdict("peak_rss")
    );
}

/// `1234567.8` as `1,234,568`.
fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_groups_digits() {
        assert_eq!(super::thousands(0.0), "0");
        assert_eq!(super::thousands(999.4), "999");
        assert_eq!(super::thousands(1_234_567.8), "1,234,568");
    }
}
