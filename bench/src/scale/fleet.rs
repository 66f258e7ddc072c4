//! The worker fleet of one run: W `shardq-bench scale-worker` processes, started
//! together (each warms its pools, says `ready`, and claims only after
//! `go`), read line by line while they run, stopped by closing their stdin.

use super::proto::{self, FinalReport, Line, Sample};
use super::timeline::Field;
use anyhow::{bail, Context, Result};
use shardq_harness::process::{Ended, Proc};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::task::JoinHandle;

/// How long the processes get to start and warm their pools.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a process gets to stop after its stdin closes.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// What the processes said: samples by process, then their final reports.
#[derive(Debug, Default)]
pub struct Output {
    /// Samples of each process, in time order.
    pub samples: Vec<Vec<Sample>>,
    /// Final reports (one per process).
    pub finals: Vec<FinalReport>,
}

type Shared = Arc<Mutex<Output>>;

struct Worker {
    proc: Proc,
    stdin: Option<ChildStdin>,
    reader: JoinHandle<Result<bool>>,
}

/// A running fleet.
pub struct Fleet {
    procs: Vec<Worker>,
    output: Shared,
}

impl Fleet {
    /// Starts `processes` workers on `config` with `env`, logs in `log_dir`,
    /// and waits until all are ready.
    pub async fn start(
        processes: usize,
        config: &Path,
        env: &[(String, String)],
        log_dir: &Path,
        name: &str,
    ) -> Result<Fleet> {
        let exe = std::env::current_exe().context("cannot find the shardq-bench binary")?;
        let output: Shared = Arc::new(Mutex::new(Output {
            samples: vec![Vec::new(); processes],
            finals: Vec::new(),
        }));
        let mut procs = Vec::with_capacity(processes);
        let mut ready = Vec::with_capacity(processes);
        for p in 0..processes {
            let mut command = Command::new(&exe);
            command
                .arg("--config")
                .arg(config)
                .arg("scale-worker")
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env(
                    "RUST_LOG",
                    std::env::var("SHARDQ_BENCH_WORKER_LOG").unwrap_or_else(|_| "warn".into()),
                )
                .stdin(Stdio::piped())
                .stdout(Stdio::piped());
            let log = log_dir.join(format!("{name}-w{p}.log"));
            let mut proc = Proc::spawn(command, log, false)?;
            let stdout = proc.child.stdout.take().context("no stdout pipe")?;
            let (tx, rx) = tokio::sync::oneshot::channel();
            ready.push(rx);
            let reader = tokio::spawn(read_lines(stdout, p, output.clone(), tx));
            procs.push(Worker {
                stdin: proc.child.stdin.take(),
                proc,
                reader,
            });
        }
        let fleet = Fleet { procs, output };
        for (p, rx) in ready.into_iter().enumerate() {
            match tokio::time::timeout(READY_TIMEOUT, rx).await {
                Ok(Ok(())) => {}
                _ => bail!(
                    "worker {p} did not get ready: {}",
                    fleet.procs[p].proc.log_tail()
                ),
            }
        }
        Ok(fleet)
    }

    /// Tells every process to start claiming.
    pub async fn go(&mut self) -> Result<()> {
        for proc in &mut self.procs {
            if let Some(stdin) = proc.stdin.as_mut() {
                stdin
                    .write_all(format!("{}\n", proto::GO).as_bytes())
                    .await?;
                stdin.flush().await?;
            }
        }
        Ok(())
    }

    /// A counter summed over all processes, by shard (from their latest samples).
    pub fn by_shard(&self, shards: usize, field: Field) -> Vec<u64> {
        let out = self.output.lock().expect("fleet output lock");
        let mut total = vec![0; shards];
        for last in out.samples.iter().filter_map(|s| s.last()) {
            for (t, c) in total.iter_mut().zip(&last.shards) {
                *t += field(c);
            }
        }
        total
    }

    /// Whether a process has exited (it should not before [`Fleet::stop`]).
    pub fn any_exited(&mut self) -> Option<String> {
        self.procs.iter_mut().find_map(|w| match w.proc.exited() {
            Ok(Some(status)) => Some(format!(
                "a worker exited early ({status}): {}",
                w.proc.log_tail()
            )),
            _ => None,
        })
    }

    /// Closes every stdin (graceful stop), waits for the processes, returns what they said.
    pub async fn stop(mut self) -> Result<Output> {
        for worker in &mut self.procs {
            worker.stdin.take();
        }
        let mut failures = Vec::new();
        for (p, worker) in self.procs.iter_mut().enumerate() {
            match worker.proc.wait_or_kill(EXIT_TIMEOUT).await {
                Ended::Exited(status) if status.success() => {}
                Ended::Exited(status) => failures.push(format!(
                    "worker {p} exited with {status}: {}",
                    worker.proc.log_tail()
                )),
                Ended::Failed(e) => failures.push(format!("worker {p}: {e}")),
                Ended::Killed => {
                    failures.push(format!("worker {p} did not stop within {EXIT_TIMEOUT:?}"))
                }
            }
            match (&mut worker.reader).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => failures.push(format!("worker {p} printed no final report")),
                Ok(Err(e)) => failures.push(format!("worker {p}: {e:#}")),
                Err(e) => failures.push(format!("worker {p} reader: {e}")),
            }
        }
        if !failures.is_empty() {
            bail!("{}", failures.join("; "));
        }
        let mut out = self.output.lock().expect("fleet output lock");
        Ok(std::mem::take(&mut *out))
    }
}

/// Reads one process's lines into `output`; `true` when its final report came.
async fn read_lines(
    stdout: tokio::process::ChildStdout,
    p: usize,
    output: Shared,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Result<bool> {
    let mut ready = Some(ready);
    let mut lines = BufReader::new(stdout).lines();
    let mut got_final = false;
    while let Some(line) = lines.next_line().await? {
        let parsed: Line =
            serde_json::from_str(&line).with_context(|| format!("worker {p} printed `{line}`"))?;
        let mut out = output.lock().expect("fleet output lock");
        match parsed {
            Line::Ready => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
            }
            Line::Sample { unix_ms, shards } => out.samples[p].push(Sample { unix_ms, shards }),
            Line::Final(report) => {
                out.finals.push(*report);
                got_final = true;
            }
        }
    }
    Ok(got_final)
}
