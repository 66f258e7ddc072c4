//! The worker processes of the reshard run (`shardq-bench chaos-worker`),
//! each on the list of two or of three shards. Two always run on the list
//! of three (through a shrink they are the old list's workers, running jobs
//! on the shard that leaves); one runs on the list the map has now, started
//! again at each move. Every so often one of them is SIGKILLed, mid-job,
//! and replaced on the list it may use; and as each shrink begins, one of
//! the old list's, so that the jobs it was running on the shard that
//! leaves are the move's to recover.

use anyhow::{Context, Result};
use rand::Rng;
use shardq_harness::process::Proc;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

/// Workers on the list of three, whatever the map.
const ON_THREE: usize = 2;

/// Pause between two kills (jittered ±50 %).
const KILL_EVERY: Duration = Duration::from_millis(1_500);

struct Worker {
    proc: Proc,
    /// On the list the map has now (else always on the list of three).
    current: bool,
}

pub struct Fleet {
    exe: PathBuf,
    /// The lists' config files: of two, of three.
    paths: [PathBuf; 2],
    logs: PathBuf,
    workers: Vec<Worker>,
    started: usize,
    /// Shards in the map now.
    count: usize,
    pub killed: u64,
    /// Of those, old-list workers killed as a shrink began.
    pub killed_before_shrink: u64,
}

impl Fleet {
    pub fn start(paths: &[PathBuf; 2], logs: &Path) -> Result<Fleet> {
        std::fs::create_dir_all(logs)?;
        let mut fleet = Fleet {
            exe: std::env::current_exe().context("cannot find the shardq-bench executable")?,
            paths: paths.clone(),
            logs: logs.to_path_buf(),
            workers: Vec::new(),
            started: 0,
            count: 2,
            killed: 0,
            killed_before_shrink: 0,
        };
        for _ in 0..ON_THREE {
            fleet.spawn(false)?;
        }
        fleet.spawn(true)?;
        Ok(fleet)
    }

    /// Starts a worker: on the list the map has now (`current`), or on
    /// the list of three.
    fn spawn(&mut self, current: bool) -> Result<()> {
        let three = !current || self.count == 3;
        let mut command = Command::new(&self.exe);
        command
            .arg("--config")
            .arg(&self.paths[usize::from(three)])
            .arg("chaos-worker")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        let log = self.logs.join(format!("worker-{}.log", self.started));
        let proc = Proc::spawn(command, log, true).context("cannot start a worker")?;
        self.started += 1;
        self.workers.push(Worker { proc, current });
        Ok(())
    }

    /// The map has `count` shards now: the worker on the current list is
    /// started again on it (a process on a shorter list than the map's
    /// would be refused).
    pub fn follow(&mut self, count: usize) -> Result<()> {
        self.count = count;
        // Dropped: killed (each is killed on drop).
        self.workers.retain(|w| !w.current);
        self.spawn(true)
    }

    /// SIGKILLs one worker at random and starts its replacement; replaces
    /// workers that exited by themselves too.
    async fn kill_one(&mut self) -> Result<()> {
        self.workers
            .retain_mut(|w| !matches!(w.proc.exited(), Ok(Some(_))));
        if !self.workers.is_empty() {
            let i = rand::thread_rng().gen_range(0..self.workers.len());
            let mut victim = self.workers.swap_remove(i);
            victim.proc.kill().await?;
            self.killed += 1;
        }
        let current = self.workers.iter().filter(|w| w.current).count();
        for _ in (self.workers.len() - current)..ON_THREE {
            self.spawn(false)?;
        }
        if current == 0 {
            self.spawn(true)?;
        }
        Ok(())
    }

    /// SIGKILLs one worker of the list of three (the old list of the
    /// shrink about to begin) and starts its replacement.
    pub async fn kill_old_list(&mut self) -> Result<()> {
        if let Some(i) = self.workers.iter().position(|w| !w.current) {
            let mut victim = self.workers.swap_remove(i);
            victim.proc.kill().await?;
            self.killed += 1;
            self.killed_before_shrink += 1;
            self.spawn(false)?;
        }
        Ok(())
    }

    /// Stops every worker (SIGTERM, then SIGKILL after a grace).
    pub async fn stop(&mut self) {
        for w in &self.workers {
            w.proc.terminate();
        }
        for w in &mut self.workers {
            let _ = w.proc.wait_or_kill(Duration::from_secs(10)).await;
        }
        self.workers.clear();
    }
}

/// Kills a worker every [`KILL_EVERY`] or so until `stop`.
pub async fn kill_now_and_then(fleet: Arc<tokio::sync::Mutex<Fleet>>, stop: CancellationToken) {
    loop {
        let pause = KILL_EVERY.mul_f64(rand::thread_rng().gen_range(0.5..1.5));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        if let Err(e) = fleet.lock().await.kill_one().await {
            tracing::error!(error = format!("{e:#}"), "cannot kill and replace a worker");
        }
    }
}
