//! A real worker process (`shardq worker --until-empty --json`, the `shardq`
//! binary built next to this one; for the serial baseline
//! `shardq-bench serial-worker`, this binary), timed from
//! spawn to exit, with its peak memory and CPU time and the database's CPU
//! time over the same span.

use super::pgcpu::{PgCpu, Sampler};
use super::server::{BenchServer, Spread, QUEUE};
use crate::procfs::{self, Clock};
use anyhow::{bail, Context, Result};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::Pid;
use serde::Serialize;
use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often the worker's peak memory is read while it runs.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// Wait after the worker exits before reading the server's CPU, so that its
/// backends have noticed the closed connections and been counted.
const BACKEND_SETTLE: Duration = Duration::from_millis(300);

/// The subprocess logs warnings only: its log lines would cost time and clutter the output.
const WORKER_LOG_FILTER: &str = "warn";

/// One worker-process run.
#[derive(Debug, Clone, Serialize)]
pub struct FleetRun {
    /// `pipeline`, `serial` or `memory`.
    pub label: String,
    /// Whether it was the serial baseline (`shardq-bench serial-worker`).
    pub serial: bool,
    /// Jobs enqueued before the run.
    pub jobs: u64,
    /// Jobs the worker reports as succeeded.
    pub succeeded: u64,
    /// Jobs the worker wrote back as anything but succeeded (failed,
    /// retrying, dead, cancelled); 0 for noop jobs.
    pub failed: u64,
    /// Seconds to enqueue the jobs before the run.
    pub prefill_s: f64,
    /// Seconds from spawn to exit (start-up and the empty check included).
    pub wall_s: f64,
    /// `succeeded / wall_s`.
    pub jobs_per_s: f64,
    /// The worker's own elapsed time, from its report.
    pub worker_elapsed_s: f64,
    /// Peak resident memory of the worker process (VmHWM), MiB.
    pub peak_rss_mib: f64,
    /// CPU seconds of the worker process (user + system, all threads).
    pub worker_cpu_s: f64,
    /// CPU seconds of the PostgreSQL server's processes over the run, by role.
    pub postgres_cpu: PgCpu,
    /// CPU seconds of every other process on the machine meanwhile (this
    /// bench's sampling included; anything large is noise from elsewhere).
    pub others_cpu_s: f64,
    /// The worker's counters as it printed them.
    pub worker_stats: serde_json::Value,
    /// WAL the server wrote during the run, bytes.
    pub wal_bytes: i64,
}

/// Refills `jobs` jobs, runs one worker process until the queue is empty.
pub async fn run(
    server: &BenchServer,
    clock: Clock,
    label: &str,
    jobs: usize,
    serial: bool,
) -> Result<FleetRun> {
    run_filled(
        server,
        clock,
        label,
        Fill::Backlog {
            jobs,
            spread: Spread::Nothing,
        },
        serial,
    )
    .await
}

/// [`run`] with the jobs spread over groups or keys.
pub async fn run_spread(
    server: &BenchServer,
    clock: Clock,
    label: &str,
    jobs: usize,
    spread: Spread,
) -> Result<FleetRun> {
    run_filled(server, clock, label, Fill::Backlog { jobs, spread }, false).await
}

/// One worker process while `jobs` no-op jobs are offered at `rate` per
/// second (enqueued in batches as the run goes, not before it; their
/// enqueue's database work counts in the run): what a queue costs at a
/// steady offer, with or without its limits.
pub async fn run_offered(
    server: &BenchServer,
    clock: Clock,
    label: &str,
    jobs: usize,
    rate: u32,
) -> Result<FleetRun> {
    run_filled(server, clock, label, Fill::Offered { jobs, rate }, false).await
}

/// The jobs of a run: enqueued before it, or offered while it runs.
enum Fill {
    Backlog { jobs: usize, spread: Spread },
    Offered { jobs: usize, rate: u32 },
}

async fn run_filled(
    server: &BenchServer,
    clock: Clock,
    label: &str,
    fill: Fill,
    serial: bool,
) -> Result<FleetRun> {
    let (jobs, prefill) = match fill {
        Fill::Backlog { jobs, spread } => (jobs, server.refill_spread(jobs, spread).await?),
        Fill::Offered { jobs, rate } => {
            let span = Duration::from_secs_f64(jobs as f64 / f64::from(rate.max(1)));
            server.reset_for_offer(span).await?;
            (jobs, Duration::ZERO)
        }
    };
    let mut command = if serial {
        let exe = std::env::current_exe().context("cannot find the shardq-bench binary")?;
        let mut command = Command::new(exe);
        command.args(["serial-worker", "--queue", QUEUE]);
        command
    } else {
        let exe = shardq_harness::exe::binary("shardq")?;
        let mut command = Command::new(exe);
        command.args(["worker", "--until-empty", "--json", "--queue", QUEUE]);
        command
    };
    command
        .arg("--config")
        .arg(server.config_path())
        // SHARDQ_* variables pass through: that is how settings are tuned.
        .env("RUST_LOG", WORKER_LOG_FILTER)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let wal_before = server.wal_position().await?;
    let pg = Sampler::start(server.postmaster())?;
    let machine_before = procfs::machine_busy_ticks()?;
    let started = Instant::now();
    let mut child = command.spawn().context("cannot start the worker process")?;
    let pid = child.id();
    let mut stdout = child.stdout.take().context("no stdout pipe")?;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let stop = CancellationToken::new();
    let sampler = tokio::spawn(sample_peak_rss(pid, stop.clone()));
    let mut guard = StopOnDrop(Some(pid));
    let waiting = tokio::task::spawn_blocking(move || wait_with_cpu(child));
    if let Fill::Offered { jobs, rate } = fill {
        server.offer(jobs, rate).await?;
    }
    let exit = waiting.await??;
    guard.0 = None;
    let wall = exit.at.duration_since(started).as_secs_f64();
    stop.cancel();
    let peak_kib = sampler.await?;
    tokio::time::sleep(BACKEND_SETTLE).await;
    let postgres_cpu = pg.finish(clock).await?;
    let wal_bytes = server.wal_position().await? - wal_before;
    let machine = clock.secs(procfs::machine_busy_ticks()? - machine_before);
    let worker_cpu_s = clock.secs(exit.cpu_ticks);
    let stdout = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the stdout reader panicked"))?
        .context("cannot read the worker's output")?;
    if !exit.status.success() {
        bail!(
            "the {label} worker exited with {}; output: {stdout}",
            exit.status
        );
    }
    let report = WorkerOutput::parse(&stdout)?;
    Ok(FleetRun {
        label: label.into(),
        serial,
        jobs: jobs as u64,
        succeeded: report.succeeded,
        failed: report.failed,
        prefill_s: prefill.as_secs_f64(),
        wall_s: wall,
        jobs_per_s: report.succeeded as f64 / wall,
        worker_elapsed_s: report.elapsed_s,
        peak_rss_mib: procfs::kib_to_mib(peak_kib),
        worker_cpu_s,
        others_cpu_s: (machine - worker_cpu_s - postgres_cpu.total_s).max(0.0),
        postgres_cpu,
        worker_stats: report.stats,
        wal_bytes,
    })
}

/// Polls the peak resident memory until `stop`; the kernel keeps the peak,
/// so only the last 50 ms before exit can be missed.
async fn sample_peak_rss(pid: u32, stop: CancellationToken) -> u64 {
    let mut peak = 0;
    loop {
        if let Some(kib) = procfs::peak_rss_kib(pid) {
            peak = peak.max(kib);
        }
        tokio::select! {
            _ = stop.cancelled() => return peak,
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
}

/// Asks the worker to stop (SIGTERM) when the run is abandoned (Ctrl-C, an
/// error), so that it does not outlive the benchmark's server.
struct StopOnDrop(Option<u32>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            shardq_harness::process::terminate(pid);
        }
    }
}

/// How the worker process ended.
struct Exit {
    status: ExitStatus,
    at: Instant,
    cpu_ticks: u64,
}

/// Waits for `child` to exit without reaping it (WNOWAIT), reads its final CPU
/// time from the zombie's /proc entry, then reaps it.
fn wait_with_cpu(mut child: std::process::Child) -> Result<Exit> {
    let pid = Pid::from_raw(i32::try_from(child.id())?);
    waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT)
        .context("cannot wait for the worker")?;
    let at = Instant::now();
    let cpu_ticks = procfs::stat(&child.id().to_string())?.own();
    let status = child.wait().context("cannot reap the worker")?;
    Ok(Exit {
        status,
        at,
        cpu_ticks,
    })
}

/// Counters of the worker's report for jobs that did not succeed.
const NOT_SUCCEEDED: &[&str] = &["failed", "retrying", "dead", "cancelled"];

/// The parts of `shardq worker --json` the benchmark reads.
struct WorkerOutput {
    succeeded: u64,
    failed: u64,
    elapsed_s: f64,
    stats: serde_json::Value,
}

impl WorkerOutput {
    /// Parses `{"stats":{"succeeded":..,..},"elapsed":{"secs":..,"nanos":..}}`.
    fn parse(stdout: &str) -> Result<WorkerOutput> {
        let value: serde_json::Value = serde_json::from_str(stdout.trim())
            .with_context(|| format!("the worker's output is not JSON: {stdout}"))?;
        let stats = value["stats"].clone();
        let count = |key: &str| {
            stats[key]
                .as_u64()
                .with_context(|| format!("the worker's report has no stats.{key}: {stdout}"))
        };
        let elapsed = &value["elapsed"];
        let secs = elapsed["secs"].as_f64().unwrap_or(0.0);
        let nanos = elapsed["nanos"].as_f64().unwrap_or(0.0);
        // Whichever of these the worker reports; none is expected for noop jobs.
        let failed = NOT_SUCCEEDED
            .iter()
            .filter_map(|key| stats[*key].as_u64())
            .sum();
        Ok(WorkerOutput {
            succeeded: count("succeeded")?,
            failed,
            elapsed_s: secs + nanos / 1e9,
            stats,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_json_parses() {
        let out = r#"{"stats":{"succeeded":5,"failed":1,"busy":0},"elapsed":{"secs":2,"nanos":500000000}}"#;
        let parsed = WorkerOutput::parse(out).unwrap();
        assert_eq!((parsed.succeeded, parsed.failed), (5, 1));
        assert!((parsed.elapsed_s - 2.5).abs() < 1e-9);
        assert!(WorkerOutput::parse("not json").is_err());
    }
}
