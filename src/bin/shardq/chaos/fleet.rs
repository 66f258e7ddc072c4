//! The worker fleet: `shardq chaos-worker` processes, each logging to its own
//! file. A killed worker is replaced at once; one that exits by itself is
//! counted as unexpected (a crash) and replaced too.

use anyhow::{Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::Rng;
use std::fs::File;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// How long stopped workers get to exit after SIGTERM before they are killed:
/// their shutdown grace (5 s) plus the final completion writes.
pub const STOP_GRACE: Duration = Duration::from_secs(15);

/// One worker process.
struct Proc {
    /// Sequential number, also its log file name.
    number: usize,
    pid: u32,
    child: Child,
}

/// The running workers and what happened to them.
pub struct Fleet {
    exe: PathBuf,
    config: PathBuf,
    logs: PathBuf,
    workers: Vec<Proc>,
    started: usize,
    /// Workers SIGKILLed by the chaos run.
    pub killed: u64,
    /// Exits nobody asked for, described.
    pub unexpected: Vec<String>,
}

impl Fleet {
    /// Starts `count` workers of this executable over `config`, logging under `logs`.
    pub fn start(config: PathBuf, logs: PathBuf, count: usize) -> Result<Fleet> {
        let exe = std::env::current_exe().context("cannot find the shardq executable")?;
        let mut fleet = Fleet {
            exe,
            config,
            logs,
            workers: Vec::with_capacity(count),
            started: 0,
            killed: 0,
            unexpected: Vec::new(),
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
        let path = self.log_path(number);
        let log =
            File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        let child = Command::new(&self.exe)
            .arg("--config")
            .arg(&self.config)
            .arg("chaos-worker")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // If `shardq chaos` fails, its workers die with it.
            .kill_on_drop(true)
            .spawn()
            .context("cannot start a chaos worker")?;
        let pid = child.id().context("a new worker has no pid")?;
        self.started += 1;
        self.workers.push(Proc { number, pid, child });
        Ok(pid)
    }

    /// SIGKILLs a random worker and starts a replacement. Returns the pids.
    pub async fn kill_random(&mut self) -> Result<(u32, u32)> {
        self.reap()?;
        let index = rand::thread_rng().gen_range(0..self.workers.len());
        let mut victim = self.workers.swap_remove(index);
        // `start_kill` sends SIGKILL; `wait` reaps it so its pid is not reused under us.
        victim.child.start_kill()?;
        victim.child.wait().await?;
        self.killed += 1;
        let replacement = self.spawn()?;
        Ok((victim.pid, replacement))
    }

    /// Replaces workers that exited without being asked; each is counted in
    /// [`Fleet::unexpected`] with its exit status and log file.
    pub fn reap(&mut self) -> Result<()> {
        let mut index = 0;
        while index < self.workers.len() {
            match self.workers[index].child.try_wait()? {
                None => index += 1,
                Some(status) => {
                    let gone = self.workers.swap_remove(index);
                    let what = format!(
                        "worker {} (pid {}) exited by itself: {status}; see {}",
                        gone.number,
                        gone.pid,
                        self.log_path(gone.number).display()
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
        for proc in &self.workers {
            let _ = kill(Pid::from_raw(proc.pid as i32), Signal::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        for mut proc in std::mem::take(&mut self.workers) {
            let left = deadline.saturating_duration_since(Instant::now());
            let problem = match tokio::time::timeout(left, proc.child.wait()).await {
                Ok(Ok(status)) if status.success() => None,
                Ok(Ok(status)) => Some(format!("exited with {status} after SIGTERM")),
                Ok(Err(err)) => Some(format!("could not be waited for: {err}")),
                Err(_) => {
                    let _ = proc.child.start_kill();
                    let _ = proc.child.wait().await;
                    Some(format!("did not stop within {grace:?} of SIGTERM; killed"))
                }
            };
            if let Some(problem) = problem {
                let what = format!(
                    "worker {} (pid {}) {problem}; see {}",
                    proc.number,
                    proc.pid,
                    self.log_path(proc.number).display()
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
