//! The files of an invocation: the JSON results (`--out`) and, beside it,
//! the per-second CSV timeline.

use super::claims::Claim;
use super::info::{Machine, Server};
use super::result::RunResult;
use anyhow::{Context, Result};
use serde::Serialize;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Settings every run shared.
#[derive(Debug, Clone, Serialize)]
pub struct Shared {
    /// Where the shards came from.
    pub shards_source: String,
    /// K (where it starts, when adaptive).
    pub slots: u32,
    /// K moves within the library's default bounds (else it stays fixed).
    pub adaptive_slots: bool,
    /// dequeue.batch_size.
    pub batch: u32,
    /// Worker processes per run at most (W).
    pub processes: usize,
    /// dequeue.lock_timeout_ms given to the workers of the disturbance runs.
    pub lock_timeout_ms: u64,
    /// dequeue.unhealthy_backoff_max_ms given to the workers of the disturbance runs.
    pub unhealthy_backoff_max_ms: u64,
    /// worker.buffer_jobs given with --buffer-jobs (null: the bench's default per run).
    pub buffer_jobs: Option<usize>,
    /// How long each job runs (ms; 0: noop jobs).
    pub job_ms: u64,
    /// Whether the disturbance runs' workers kept the library's lock wait,
    /// statement deadline and failing-shard backoff.
    pub worker_defaults: bool,
    /// Sweep repetitions.
    pub repeat: usize,
    /// How often workers report their counters (ms).
    pub sample_every_ms: u64,
    /// Seconds left out at the start of rate runs.
    pub warmup_s: f64,
    /// `--db-set` server settings (experiments).
    pub db_set: Vec<String>,
}

/// The whole JSON file.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The command line.
    pub command: String,
    /// Start, seconds since the Unix epoch.
    pub started_unix_s: f64,
    /// Wall time of the whole invocation.
    pub duration_s: f64,
    /// The machine.
    pub machine: Machine,
    /// Every server's settings.
    pub servers: Vec<Server>,
    /// Shared settings.
    pub settings: Shared,
    /// One object per run.
    pub runs: Vec<RunResult>,
    /// The expected outcomes, judged.
    pub claims: Vec<Claim>,
}

/// The CSV timeline's path: `scale.json` → `scale_timeline.csv`.
pub fn csv_path(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map_or("scale".into(), |s| s.to_string_lossy().into_owned());
    out.with_file_name(format!("{stem}_timeline.csv"))
}

impl Report {
    /// Writes the JSON to `out` and the CSV beside it; returns the CSV's path.
    pub fn write(&self, out: &Path) -> Result<PathBuf> {
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(out, json + "\n")
            .with_context(|| format!("cannot write {}", out.display()))?;
        let csv = csv_path(out);
        std::fs::write(&csv, self.csv())
            .with_context(|| format!("cannot write {}", csv.display()))?;
        Ok(csv)
    }

    /// One line per run, second and shard.
    fn csv(&self) -> String {
        let mut text = String::from(
            "run,kind,mode,shards,dequeuers_per_shard,t_s,shard,completed_per_s,claimed_per_s,claims_per_s,busy_per_s,empty_per_s,errors_per_s\n",
        );
        for r in &self.runs {
            for s in &r.seconds {
                let _ = writeln!(
                    text,
                    "{},{},{},{},{},{},{},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1}",
                    r.id,
                    r.kind,
                    r.mode.name(),
                    r.shards,
                    r.dequeuers_per_shard,
                    s.t,
                    s.shard,
                    s.completed,
                    s.claimed,
                    s.claims,
                    s.busy,
                    s.empty,
                    s.errors
                );
            }
        }
        text
    }
}
