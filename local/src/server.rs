//! One local PostgreSQL server: a data folder plus a loopback port.

use std::path::{Path, PathBuf};

use super::binaries::{pg_command, run};
use super::datadir::create_data_dir;
use super::error::LocalError;

/// Seconds pg_ctl waits for the server to start or stop.
const WAIT_SECS: &str = "60";
/// How many lines of server.log a start failure reports.
const LOG_TAIL_LINES: usize = 20;

/// How to stop a server (see `pg_ctl stop -m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// Disconnect clients, then shut down cleanly with a checkpoint.
    Fast,
    /// Kill everything at once, like a crash; the next start runs recovery.
    Immediate,
}

impl StopMode {
    fn as_arg(self) -> &'static str {
        match self {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

/// A PostgreSQL server listening on `127.0.0.1:port` with its data in `data_dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalServer {
    /// The shard number of this server.
    pub index: usize,
    /// The TCP port on 127.0.0.1.
    pub port: u16,
    /// The data folder (`root/shard-{index}`).
    pub data_dir: PathBuf,
}

impl LocalServer {
    /// Describes server `index` under `root`; nothing is created until [`LocalServer::start`].
    pub fn new(root: &Path, index: usize, port: u16) -> Self {
        LocalServer {
            index,
            port,
            data_dir: root.join(format!("shard-{index}")),
        }
    }

    /// The URL of the `shardq` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/shardq", self.port)
    }

    /// The URL of the `postgres` maintenance database.
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The data folder as an absolute path, since commands run from `/` as root.
    fn dir(&self) -> PathBuf {
        std::path::absolute(&self.data_dir).unwrap_or_else(|_| self.data_dir.clone())
    }

    /// Whether a postmaster is running on this data folder (`pg_ctl status`).
    pub fn is_running(&self) -> bool {
        let dir = self.dir();
        // No pid file means not running; skips spawning pg_ctl.
        if !dir.join("postmaster.pid").exists() {
            return false;
        }
        let Ok(mut cmd) = pg_command("pg_ctl") else {
            return false;
        };
        cmd.arg("status").arg("-D").arg(&dir);
        run(&mut cmd).is_ok()
    }

    /// Creates the data folder if missing, then starts the server unless it runs already,
    /// waiting up to 60 s until it accepts connections.
    pub fn start(&self) -> Result<(), LocalError> {
        let dir = self.dir();
        if !dir.join("PG_VERSION").is_file() {
            create_data_dir(&dir)?;
        }
        if self.is_running() {
            return Ok(());
        }
        let log = dir.join("server.log");
        let mut cmd = pg_command("pg_ctl")?;
        cmd.arg("-D")
            .arg(&dir)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", WAIT_SECS, "-o"])
            .arg(format!("-p {}", self.port))
            .arg("start");
        match run(&mut cmd) {
            Ok(_) => Ok(()),
            Err(LocalError::CommandFailed { stderr, .. }) => Err(LocalError::StartFailed {
                data_dir: dir,
                stderr,
                log_tail: log_tail(&log),
            }),
            Err(e) => Err(e),
        }
    }

    /// Stops the server and waits for it to exit; does nothing if it is not running.
    pub fn stop(&self, mode: StopMode) -> Result<(), LocalError> {
        if !self.is_running() {
            return Ok(());
        }
        let mut cmd = pg_command("pg_ctl")?;
        cmd.arg("-D")
            .arg(self.dir())
            .args(["-m", mode.as_arg(), "-w", "-t", WAIT_SECS, "stop"]);
        match run(&mut cmd) {
            // It may have stopped between our check and pg_ctl's.
            Err(_) if !self.is_running() => Ok(()),
            other => other.map(drop),
        }
    }
}

impl LocalServer {
    /// Sends `signal` to the postmaster and every process it started (its
    /// backends and helpers). `SIGSTOP` freezes the server without closing a
    /// connection, the way a hung host looks from a client; `SIGCONT` thaws it.
    ///
    /// # Errors
    ///
    /// When the server is not running or the signal cannot be sent.
    pub fn signal_all(&self, signal: nix::sys::signal::Signal) -> Result<usize, LocalError> {
        let pid_file = self.dir().join("postmaster.pid");
        let io = |action, source| LocalError::Io {
            action,
            path: pid_file.clone(),
            source,
        };
        let text = std::fs::read_to_string(&pid_file).map_err(|e| io("read the pid file", e))?;
        let postmaster: i32 = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| {
                io(
                    "read the postmaster pid",
                    std::io::Error::other("no pid on the first line"),
                )
            })?;
        // The postmaster first when stopping (so it forks no backend after
        // the listing), last when continuing. A process that exited
        // meanwhile (ESRCH) is skipped: every other one must still get it.
        let send = |pid: i32| match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
        {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(io("signal the server's processes", e.into())),
        };
        let stopping = signal == nix::sys::signal::Signal::SIGSTOP;
        if stopping {
            send(postmaster)?;
        }
        let mut pids = children_of(postmaster);
        for pid in &pids {
            send(*pid)?;
        }
        if !stopping {
            send(postmaster)?;
        }
        pids.push(postmaster);
        Ok(pids.len())
    }
}

/// The processes whose parent is `parent`, from /proc.
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // The command may hold spaces: fields resume after the last ')'.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

fn log_tail(log: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(log) else {
        return format!("(could not read {})", log.display());
    };
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}
