//! Child processes of a run (worker processes, mostly): started with their
//! output in a log file and killed if the run drops them, asked to stop with
//! SIGTERM or killed, waited for with a deadline.

use anyhow::{Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::process::{Child, Command};

/// Lines of a log quoted in errors.
const LOG_TAIL: usize = 15;

/// A running child process and its log file.
pub struct Proc {
    /// The process; killed when dropped.
    pub child: Child,
    /// Its pid, kept after it is reaped.
    pub pid: u32,
    /// The file its stderr (and stdout unless piped) goes to.
    pub log: PathBuf,
}

/// How a process ended when waited for with a deadline.
#[derive(Debug)]
pub enum Ended {
    /// It exited with this status.
    Exited(ExitStatus),
    /// It could not be waited for.
    Failed(std::io::Error),
    /// It was still running at the deadline and was killed.
    Killed,
}

impl Proc {
    /// Starts `command` with stderr to a new file `log`, and stdout too
    /// unless `command` pipes it already; killed on drop, so that a failed
    /// run leaves no process behind.
    ///
    /// # Errors
    ///
    /// When the log cannot be created or the process not started.
    pub fn spawn(mut command: Command, log: PathBuf, stdout_to_log: bool) -> Result<Proc> {
        let file =
            File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        if stdout_to_log {
            command.stdout(file.try_clone()?);
        }
        let child = command
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {:?}", command.as_std().get_program()))?;
        let pid = child.id().context("a new process has no pid")?;
        Ok(Proc { child, pid, log })
    }

    /// Asks the process to stop (SIGTERM); ignores one that is gone.
    pub fn terminate(&self) {
        terminate(self.pid);
    }

    /// SIGKILLs the process and reaps it, so that its pid is not reused under us.
    ///
    /// # Errors
    ///
    /// When it cannot be signalled or waited for.
    pub async fn kill(&mut self) -> Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }

    /// Its exit status if it has exited (without blocking).
    ///
    /// # Errors
    ///
    /// When it cannot be polled.
    pub fn exited(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Waits up to `limit` for the process to exit, then kills it.
    pub async fn wait_or_kill(&mut self, limit: Duration) -> Ended {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) => Ended::Exited(status),
            Ok(Err(err)) => Ended::Failed(err),
            Err(_) => {
                let _ = self.kill().await;
                Ended::Killed
            }
        }
    }

    /// The last lines of its log, for errors.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }
}

/// Sends SIGTERM to `pid`; a process that is gone is ignored.
pub fn terminate(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
}

/// The last [`LOG_TAIL`] lines of the log at `path`, headed by its path.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n");
    format!("log {}:\n{tail}", path.display())
}
