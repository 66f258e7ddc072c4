//! The worker fleet: `shardq-bench chaos-worker` processes, each logging to its own
//! file. A killed worker is replaced at once; one that exits by itself is
//! counted as unexpected (a crash) and replaced too. A worker may be stopped
//! (SIGSTOP) for a while; it is left alone by the kills until it continues.

use super::names::{AHEAD_ENV, STOPS_ON_SIGTERM};
use anyhow::{Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use rand::Rng;
use shardq_harness::process::{Ended, Proc};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Command;

/// How long stopped workers get to exit after SIGTERM before they are killed:
/// their shutdown grace (5 s) plus the final completion writes.
pub const STOP_GRACE: Duration = Duration::from_secs(15);

/// How long a stop waits for a worker just started to catch SIGTERM.
const READY_WAIT: Duration = Duration::from_secs(10);

/// One worker process.
struct Worker {
    /// Sequential number, also its log file name.
    number: usize,
    proc: Proc,
    /// SIGSTOPped by the stop fault, not yet continued.
    paused: bool,
    /// Runs the torture schedule with its scheduler clock ahead.
    skewed: bool,
}

/// The running workers and what happened to them.
pub struct Fleet {
    exe: PathBuf,
    config: PathBuf,
    logs: PathBuf,
    workers: Vec<Worker>,
    started: usize,
    /// Workers SIGKILLed by the chaos run.
    pub killed: u64,
    /// Exits nobody asked for, described.
    pub unexpected: Vec<String>,
    /// Workers stopped for longer than their lease.
    pub lost_leases: Vec<u32>,
    /// Torture: one worker at a time (a replacement when it goes) runs the
    /// schedule with its scheduler clock this far ahead.
    skew: Option<chrono::TimeDelta>,
}

impl Fleet {
    /// Starts `count` workers of this executable over `config`, logging
    /// under `logs`; with `skew`, one of them at a time is the skewed
    /// scheduler (see `torture::ticks`).
    pub fn start(
        config: PathBuf,
        logs: PathBuf,
        count: usize,
        skew: Option<chrono::TimeDelta>,
    ) -> Result<Fleet> {
        let exe = std::env::current_exe().context("cannot find the shardq-bench executable")?;
        let mut fleet = Fleet {
            exe,
            config,
            logs,
            workers: Vec::with_capacity(count),
            started: 0,
            killed: 0,
            unexpected: Vec::new(),
            lost_leases: Vec::new(),
            skew,
        };
        for _ in 0..count {
            fleet.spawn()?;
        }
        Ok(fleet)
    }

    /// Workers started so far, replacements included.
    pub fn started(&self) -> usize {
        self.started
    }

    fn spawn(&mut self) -> Result<u32> {
        let number = self.started;
        let mut command = Command::new(&self.exe);
        command
            .arg("--config")
            .arg(&self.config)
            .arg("chaos-worker")
            .stdin(Stdio::null());
        // The first worker, and the replacement of a skewed one that went.
        let skewed = match self.skew {
            Some(ahead) if !self.workers.iter().any(|w| w.skewed) => {
                command.env(AHEAD_ENV, ahead.num_seconds().to_string());
                true
            }
            _ => false,
        };
        // Killed on drop: if `shardq-bench chaos` fails, its workers die with it.
        let proc = Proc::spawn(command, self.log_path(number), true)
            .context("cannot start a chaos worker")?;
        let pid = proc.pid;
        self.started += 1;
        self.workers.push(Worker {
            number,
            proc,
            paused: false,
            skewed,
        });
        Ok(pid)
    }

    /// SIGKILLs a random worker and starts a replacement. Returns the pids.
    pub async fn kill_random(&mut self) -> Result<(u32, u32)> {
        self.reap()?;
        let index = self.random_running()?;
        let mut victim = self.workers.swap_remove(index);
        victim.proc.kill().await?;
        self.killed += 1;
        let replacement = self.spawn()?;
        Ok((victim.proc.pid, replacement))
    }

    /// SIGSTOPs a random running worker (noted in [`Fleet::lost_leases`]
    /// when it stays stopped `past_lease`); returns its pid for [`Fleet::resume`].
    pub fn pause_random(&mut self, past_lease: bool) -> Result<u32> {
        self.reap()?;
        let index = self.random_running()?;
        let worker = &mut self.workers[index];
        signal(worker.proc.pid, Signal::SIGSTOP)?;
        worker.paused = true;
        let pid = worker.proc.pid;
        if past_lease {
            self.lost_leases.push(pid);
        }
        Ok(pid)
    }

    /// SIGCONTs the paused worker `pid`; false if it is no longer in the fleet.
    pub fn resume(&mut self, pid: u32) -> bool {
        let Some(worker) = self.workers.iter_mut().find(|w| w.proc.pid == pid) else {
            return false;
        };
        worker.paused = false;
        if let Err(err) = signal(pid, Signal::SIGCONT) {
            tracing::error!(pid, error = format!("{err:#}"), "cannot continue a worker");
        }
        true
    }

    /// The index of a random worker that is not paused.
    fn random_running(&self) -> Result<usize> {
        let running: Vec<usize> = (0..self.workers.len())
            .filter(|&i| !self.workers[i].paused)
            .collect();
        anyhow::ensure!(!running.is_empty(), "every worker is paused");
        Ok(running[rand::thread_rng().gen_range(0..running.len())])
    }

    /// Replaces workers that exited without being asked; each is counted in
    /// [`Fleet::unexpected`] with its exit status and log file.
    pub fn reap(&mut self) -> Result<()> {
        let mut index = 0;
        while index < self.workers.len() {
            match self.workers[index].proc.exited()? {
                None => index += 1,
                Some(status) => {
                    let gone = self.workers.swap_remove(index);
                    let what = format!(
                        "worker {} (pid {}) exited by itself: {status}; see {}",
                        gone.number,
                        gone.proc.pid,
                        gone.proc.log.display()
                    );
                    tracing::error!("{what}");
                    self.unexpected.push(what);
                    self.spawn()?;
                }
            }
        }
        Ok(())
    }

    /// Stops every worker: SIGTERM (graceful: running handlers finish, every
    /// completion is written), then SIGKILL for those still running after
    /// `grace`. A worker that fails its graceful stop counts as unexpected.
    pub async fn stop(&mut self, grace: Duration) -> Result<()> {
        self.reap()?;
        let paused: Vec<u32> = self
            .workers
            .iter()
            .filter(|w| w.paused)
            .map(|w| w.proc.pid)
            .collect();
        for pid in paused {
            self.resume(pid);
        }
        // A worker started a moment ago may not catch SIGTERM yet.
        for worker in &self.workers {
            stops_on_sigterm(&worker.proc.log, READY_WAIT).await;
        }
        for worker in &self.workers {
            worker.proc.terminate();
        }
        let deadline = Instant::now() + grace;
        for mut worker in std::mem::take(&mut self.workers) {
            let left = deadline.saturating_duration_since(Instant::now());
            let problem = match worker.proc.wait_or_kill(left).await {
                Ended::Exited(status) if status.success() => None,
                Ended::Exited(status) => Some(format!("exited with {status} after SIGTERM")),
                Ended::Failed(err) => Some(format!("could not be waited for: {err}")),
                Ended::Killed => Some(format!("did not stop within {grace:?} of SIGTERM; killed")),
            };
            if let Some(problem) = problem {
                let what = format!(
                    "worker {} (pid {}) {problem}; see {}",
                    worker.number,
                    worker.proc.pid,
                    worker.proc.log.display()
                );
                tracing::error!("{what}");
                self.unexpected.push(what);
            }
        }
        Ok(())
    }

    fn log_path(&self, number: usize) -> PathBuf {
        self.logs.join(format!("worker-{number}.log"))
    }
}

/// Waits until the worker logging to `log` says SIGTERM stops it gracefully
/// ([`STOPS_ON_SIGTERM`]), at most `limit`.
async fn stops_on_sigterm(log: &std::path::Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let text = tokio::fs::read_to_string(log).await.unwrap_or_default();
        if text.contains(STOPS_ON_SIGTERM) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `signal` to process `pid`.
fn signal(pid: u32, signal: Signal) -> Result<()> {
    let pid = i32::try_from(pid).context("pid out of range")?;
    nix::sys::signal::kill(Pid::from_raw(pid), signal)
        .with_context(|| format!("cannot send {signal} to pid {pid}"))
}
