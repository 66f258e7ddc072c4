//! The results: one serializable record, printed as tables and written as JSON.

use super::args::PipelineArgs;
use super::ceiling::{self, CeilingRun};
use super::fleet::FleetRun;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Goal: the pipelined worker at least this many times the serial baseline.
pub const GOAL_OVER_SERIAL: f64 = 10.0;
/// Goal: the pipelined worker at least this share of the statement ceiling.
pub const GOAL_OVER_CEILING: f64 = 0.5;
/// Goal: the worker's peak resident memory below this many MiB.
pub const GOAL_PEAK_RSS_MIB: f64 = 64.0;
/// Environment variables with this prefix configure the worker subprocesses.
const ENV_PREFIX: &str = "SHARDQ_";
/// Names the config file, which the bench replaces with its own.
const ENV_IGNORED: &str = "SHARDQ_CONFIG";

/// The machine the numbers come from.
#[derive(Debug, Serialize)]
pub struct Machine {
    /// Cores available (`nproc`).
    pub cpus: usize,
    /// `MemTotal` in MiB.
    pub mem_total_mib: f64,
    /// Says that everything shares these cores.
    pub note: String,
    /// `/proc/loadavg` when the benchmark started (1, 5, 15 minutes).
    pub loadavg_at_start: String,
}

/// What was asked for.
#[derive(Debug, Serialize)]
pub struct Settings {
    /// Shards (always one).
    pub shards: usize,
    /// Jobs per ceiling run and for the pipelined run.
    pub jobs: usize,
    /// Jobs for the serial run.
    pub serial_jobs: usize,
    /// Jobs for the memory run (0: skipped).
    pub memory_jobs: usize,
    /// Claim batch of the ceiling runs.
    pub ceiling_batch: u32,
    /// The job table's fillfactor, when `--table-fillfactor` overrode the
    /// migrations' 40.
    pub table_fillfactor: Option<u8>,
    /// `SHARDQ_*` variables the worker subprocesses inherited (URLs redacted).
    pub worker_env: BTreeMap<String, String>,
}

impl Settings {
    /// From the flags and the environment.
    pub fn new(args: &PipelineArgs) -> Settings {
        let worker_env = std::env::vars()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k != ENV_IGNORED)
            .map(|(k, v)| (k, shardq::config::redact_url(&v)))
            .collect();
        Settings {
            shards: 1,
            jobs: args.jobs,
            serial_jobs: args.serial_jobs,
            memory_jobs: args.memory_jobs,
            ceiling_batch: ceiling::BATCH,
            table_fillfactor: args.table_fillfactor,
            worker_env,
        }
    }
}

/// The ratios the goals are about.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Best ceiling run's jobs/s ("statement ceiling").
    pub ceiling_jobs_per_s: f64,
    /// Dequeuers of that run.
    pub ceiling_dequeuers: usize,
    /// Pipelined jobs/s over serial jobs/s.
    pub pipeline_over_serial: f64,
    /// Pipelined jobs/s over the ceiling.
    pub pipeline_over_ceiling: f64,
    /// Best minimal ceiling run's jobs/s (bare table).
    pub minimal_jobs_per_s: f64,
    /// Pipelined jobs/s over the minimal ceiling (no goal yet: the
    /// performance issue's is 70%).
    pub pipeline_over_minimal: f64,
    /// Largest peak RSS of any pipelined worker run, MiB.
    pub peak_rss_mib: f64,
    /// Most cores other processes used, on average over one run's wall time
    /// (noise: near 0 on a quiet machine).
    pub others_cores_max: f64,
    /// Whether each goal was met.
    pub goals_met: BTreeMap<&'static str, bool>,
}

/// Everything one invocation measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Which benchmark.
    pub benchmark: &'static str,
    /// When it finished, seconds since the Unix epoch.
    pub finished_unix_s: u64,
    /// Cores and memory.
    pub machine: Machine,
    /// `SHOW server_version`.
    pub postgres_version: String,
    /// Flags and environment.
    pub settings: Settings,
    /// One run per dequeuer count.
    pub ceiling: Vec<CeilingRun>,
    /// The minimal ceiling (bare table), per dequeuer count.
    pub minimal: Vec<CeilingRun>,
    /// The pipelined worker.
    pub pipeline: FleetRun,
    /// The serial baseline.
    pub serial: FleetRun,
    /// The memory run, when asked for.
    pub memory: Option<FleetRun>,
    /// Ratios against the goals.
    pub summary: Summary,
}

/// The runs, as measured.
pub struct Runs {
    /// Ceiling runs.
    pub ceiling: Vec<CeilingRun>,
    /// Minimal ceiling runs.
    pub minimal: Vec<CeilingRun>,
    /// Pipelined worker.
    pub pipeline: FleetRun,
    /// Serial worker.
    pub serial: FleetRun,
    /// Memory run.
    pub memory: Option<FleetRun>,
}

impl Report {
    /// Computes the summary.
    pub fn new(
        machine: Machine,
        postgres_version: String,
        settings: Settings,
        runs: Runs,
    ) -> Result<Report> {
        let best = ceiling::best(&runs.ceiling).context("no ceiling run")?;
        let peak_rss_mib = runs
            .memory
            .iter()
            .chain([&runs.pipeline])
            .map(|r| r.peak_rss_mib)
            .fold(0.0, f64::max);
        let pipeline_over_serial = runs.pipeline.jobs_per_s / runs.serial.jobs_per_s;
        let pipeline_over_ceiling = runs.pipeline.jobs_per_s / best.jobs_per_s;
        let minimal_jobs_per_s = ceiling::best(&runs.minimal).map_or(0.0, |m| m.jobs_per_s);
        let pipeline_over_minimal = runs.pipeline.jobs_per_s / minimal_jobs_per_s.max(1e-9);
        let goals_met = BTreeMap::from([
            (
                "pipeline_over_serial",
                pipeline_over_serial >= GOAL_OVER_SERIAL,
            ),
            (
                "pipeline_over_ceiling",
                pipeline_over_ceiling >= GOAL_OVER_CEILING,
            ),
            ("peak_rss", peak_rss_mib < GOAL_PEAK_RSS_MIB),
        ]);
        let others_cores_max = runs
            .ceiling
            .iter()
            .chain(&runs.minimal)
            .map(|c| c.others_cpu_s / c.wall_s)
            .chain(
                [&runs.pipeline, &runs.serial]
                    .into_iter()
                    .chain(runs.memory.as_ref())
                    .map(|f| f.others_cpu_s / f.wall_s),
            )
            .fold(0.0, f64::max);
        let summary = Summary {
            others_cores_max,
            ceiling_jobs_per_s: best.jobs_per_s,
            ceiling_dequeuers: best.dequeuers,
            pipeline_over_serial,
            pipeline_over_ceiling,
            minimal_jobs_per_s,
            pipeline_over_minimal,
            peak_rss_mib,
            goals_met,
        };
        let finished_unix_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(Report {
            benchmark: "pipeline",
            finished_unix_s,
            machine,
            postgres_version,
            settings,
            ceiling: runs.ceiling,
            minimal: runs.minimal,
            pipeline: runs.pipeline,
            serial: runs.serial,
            memory: runs.memory,
            summary,
        })
    }

    fn worker_runs(&self) -> impl Iterator<Item = &FleetRun> {
        [&self.pipeline, &self.serial]
            .into_iter()
            .chain(self.memory.as_ref())
    }

    /// Writes the JSON to `path`, creating its folder.
    pub fn write(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let text = serde_json::to_string_pretty(self)? + "\n";
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
    }

    /// Fails when a worker did not complete exactly the jobs it was given
    /// (the numbers would then be meaningless).
    pub fn check(&self) -> Result<()> {
        for run in self.worker_runs() {
            if run.succeeded != run.jobs || run.failed != 0 {
                bail!(
                    "the {} worker completed {} of {} jobs ({} failed); its numbers are not valid",
                    run.label,
                    run.succeeded,
                    run.jobs,
                    run.failed
                );
            }
        }
        Ok(())
    }
}

impl Summary {
    /// `met` or `MISSED`.
    pub fn verdict(&self, goal: &str) -> &'static str {
        match self.goals_met.get(goal) {
            Some(true) => "met",
            _ => "MISSED",
        }
    }
}
