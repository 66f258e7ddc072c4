//! Local PostgreSQL servers (one per shard, built on [`shardq_local`]) in a
//! temporary folder of their own, stopped and deleted at the end, also when
//! the run fails or is dropped.

use anyhow::{bail, Context, Result};
use rand::Rng;
use shardq_local::{LocalOptions, LocalServer, StopMode};
use std::fs::{self, DirBuilder, Permissions};
use std::net::{Ipv4Addr, TcpListener};
use std::ops::Range;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where free port ranges are looked for: above the usual services, below
/// the kernel's ephemeral range.
const PORT_RANGE: Range<u16> = 20_000..32_000;

/// Random base ports tried before giving up.
const PORT_PROBES: usize = 50;

/// A fresh folder under the system temp dir with a `logs` folder in it,
/// deleted on drop unless [`TempRoot::keep`] is set.
pub struct TempRoot {
    path: PathBuf,
    /// Leave the folder behind (and say where it is).
    pub keep: bool,
}

impl TempRoot {
    /// Creates `<tmp>/<prefix>-<pid>-<random>/logs`, mode 0755 so that the
    /// `postgres` user can reach data folders in it when we run as root.
    ///
    /// # Errors
    ///
    /// When the folder cannot be created.
    pub fn new(prefix: &str) -> Result<TempRoot> {
        let name = format!(
            "{prefix}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        let path = std::env::temp_dir().join(name);
        DirBuilder::new()
            .mode(0o755)
            .recursive(true)
            .create(path.join("logs"))
            .with_context(|| format!("cannot create {}", path.display()))?;
        fs::set_permissions(&path, Permissions::from_mode(0o755))?;
        Ok(TempRoot { path, keep: false })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The folder for process logs.
    pub fn log_dir(&self) -> PathBuf {
        self.path.join("logs")
    }
}

impl Drop for TempRoot {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("kept {}", self.path.display());
        } else if let Err(err) = fs::remove_dir_all(&self.path) {
            tracing::warn!(root = %self.path.display(), error = %err, "cannot delete the temporary folder");
        }
    }
}

/// `n` local servers with their data under `<root>/data`, each with a
/// `shardq` database.
pub struct LocalCluster {
    opts: LocalOptions,
    servers: Vec<LocalServer>,
    torn_down: bool,
    // Declared last: the servers stop before their folder goes.
    root: TempRoot,
}

impl LocalCluster {
    /// Starts `n` servers on `base_port..` (or free loopback ports) in a new
    /// folder named after `prefix`. Whatever was started is stopped again
    /// when this fails.
    ///
    /// # Errors
    ///
    /// When no free ports are found or a server does not start.
    pub async fn start(prefix: &str, n: usize, base_port: Option<u16>) -> Result<LocalCluster> {
        let root = TempRoot::new(prefix)?;
        let opts = LocalOptions {
            root: root.path().join("data"),
            base_port: match base_port {
                Some(port) => port,
                None => free_base_port(n)?,
            },
            shards: n,
        };
        // Built before anything starts, so that Drop cleans up after a failure below.
        let cluster = LocalCluster {
            servers: shardq_local::servers(&opts),
            opts,
            torn_down: false,
            root,
        };
        let started = Instant::now();
        shardq_local::up(&cluster.opts)
            .await
            .context("cannot start the local shards")?;
        tracing::info!(
            root = %cluster.root.path().display(),
            base_port = cluster.opts.base_port,
            seconds = started.elapsed().as_secs_f64(),
            "local shards up"
        );
        Ok(cluster)
    }

    /// The temporary folder (data, logs, config files).
    pub fn root(&self) -> &TempRoot {
        &self.root
    }

    /// Keep the temporary folder at teardown.
    pub fn keep(&mut self, keep: bool) {
        self.root.keep = keep;
    }

    /// The servers, in shard order.
    pub fn servers(&self) -> &[LocalServer] {
        &self.servers
    }

    /// The URL of server `index`'s `shardq` database.
    pub fn url(&self, index: usize) -> String {
        self.servers[index].url()
    }

    /// The port of server 0 (server `i` listens on it plus `i`).
    pub fn base_port(&self) -> u16 {
        self.opts.base_port
    }

    /// Stops server `index` in immediate mode (a crash: no checkpoint,
    /// clients cut off), keeps it down for `down`, and starts it again,
    /// which runs crash recovery. Returns how long it was down.
    ///
    /// # Errors
    ///
    /// When the server does not stop or start.
    pub async fn crash_restart(&self, index: usize, down: Duration) -> Result<Duration> {
        let server = self.servers[index].clone();
        let stopped = server.clone();
        let at = Instant::now();
        tokio::task::spawn_blocking(move || stopped.stop(StopMode::Immediate)).await??;
        tokio::time::sleep(down).await;
        tokio::task::spawn_blocking(move || server.start()).await??;
        Ok(at.elapsed())
    }

    /// Freezes server `index` for `hold`: every process of it is stopped
    /// (SIGSTOP), so connections stay open and nothing answers, as when a
    /// host hangs; then they are continued (SIGCONT). Returns how many
    /// processes were stopped.
    ///
    /// # Errors
    ///
    /// When the processes cannot be signalled.
    pub async fn freeze(&self, index: usize, hold: Duration) -> Result<usize> {
        use nix::sys::signal::Signal;
        let stopped = self.servers[index].signal_all(Signal::SIGSTOP)?;
        tokio::time::sleep(hold).await;
        self.servers[index].signal_all(Signal::SIGCONT)?;
        Ok(stopped)
    }

    /// Stops the servers; the folder goes when the cluster is dropped.
    ///
    /// # Errors
    ///
    /// When a server does not stop (all are tried).
    pub fn teardown(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.torn_down, true) {
            return Ok(());
        }
        shardq_local::down(&self.opts).context("cannot stop the local shards")
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if let Err(err) = self.teardown() {
            tracing::warn!(error = format!("{err:#}"), "local cluster teardown failed");
        }
    }
}

/// A base port whose `count` consecutive ports were all free a moment ago.
fn free_base_port(count: usize) -> Result<u16> {
    let mut rng = rand::thread_rng();
    for _ in 0..PORT_PROBES {
        let base = rng.gen_range(PORT_RANGE);
        let free = (0..count as u16)
            .map_while(|i| TcpListener::bind((Ipv4Addr::LOCALHOST, base + i)).ok())
            .count();
        if free == count {
            return Ok(base);
        }
    }
    bail!(
        "found no {count} consecutive free ports in {}..{}; give a base port",
        PORT_RANGE.start,
        PORT_RANGE.end
    )
}
