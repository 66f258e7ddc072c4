//! The cluster under test: fresh local PostgreSQL servers in a temporary
//! folder, migrated, with the `shards.toml` that the chaos workers read. It is
//! stopped and deleted at the end, also when the run fails.

use super::{sql, worker};
use anyhow::{bail, Context, Result};
use rand::Rng;
use shardq::config::Config;
use shardq::local::{LocalOptions, LocalServer, StopMode};
use shardq::shards::ShardSet;
use std::fs::{self, DirBuilder, Permissions};
use std::net::{Ipv4Addr, TcpListener};
use std::ops::Range;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Servers (shards) of the chaos cluster.
pub const SHARDS: usize = 4;

/// Where free port ranges are looked for: above the usual services, below
/// the kernel's ephemeral range.
const PORT_RANGE: Range<u16> = 20_000..32_000;

/// Random base ports tried before giving up.
const PORT_PROBES: usize = 50;

/// Connections each process may open to each shard (the fleet, the enqueuer
/// and the checks together stay far below the servers' 300).
const POOL_SIZE: usize = 8;

/// Worker settings of the chaos fleet, appended to the shard list (`{queue}`
/// is replaced by the chaos queue).
const WORKER_SETTINGS: &str = r#"
[dequeue]
# A restarted shard is retried within a second, not after up to 10 s.
unhealthy_backoff_max_ms = 1000
connect_timeout_ms = 2000
# A frozen shard's statements give up within a second (the lease is 2 s).
statement_timeout_ms = 1000

[worker]
queues = ["{queue}"]
# Short leases: a killed worker's jobs come back within ~2 s.
lease_ms = 2000
maintenance_interval_ms = 300
# An attempt that failed because its connection was killed retries soon.
retry_backoff_min_ms = 100
retry_backoff_max_ms = 2000
shutdown_grace_ms = 5000
"#;

/// The servers, their folder and the config that points at them.
pub struct Cluster {
    /// The temporary folder: data folders, worker logs, the config file.
    pub root: PathBuf,
    /// The config file the workers read.
    pub config_path: PathBuf,
    /// The same config, parsed.
    pub config: Config,
    opts: LocalOptions,
    servers: Vec<LocalServer>,
    keep: bool,
    torn_down: bool,
}

impl Cluster {
    /// Starts [`SHARDS`] servers on `base_port..` (or free ports), migrates
    /// them and creates the side-effect table. Whatever was started is torn
    /// down again when this fails.
    pub async fn start(base_port: Option<u16>, keep: bool) -> Result<Cluster> {
        let root = make_root()?;
        let opts = LocalOptions {
            root: root.clone(),
            base_port: match base_port {
                Some(port) => port,
                None => free_base_port(SHARDS)?,
            },
            shards: SHARDS,
        };
        let servers = shardq::local::servers(&opts);
        let config_path = root.join("shards.toml");
        let text = config_text(&servers);
        // Built before anything starts, so that Drop cleans up after a failure below.
        let cluster = Cluster {
            config: Config::from_toml(&text).context("the chaos config is invalid")?,
            root,
            config_path,
            opts,
            servers,
            keep,
            torn_down: false,
        };
        fs::write(&cluster.config_path, text)
            .with_context(|| format!("cannot write {}", cluster.config_path.display()))?;
        fs::create_dir_all(cluster.log_dir())?;
        let started = Instant::now();
        shardq::local::up(&cluster.opts)
            .await
            .context("cannot start the chaos shards")?;
        let shards = ShardSet::connect(&cluster.config)?;
        shardq::migrate::migrate_all(&shards).await?;
        for shard in shards.all() {
            let db = shard.client().await?;
            db.batch_execute(sql::EFFECTS_CREATE)
                .await
                .map_err(|e| shard.query_error(e))?;
        }
        tracing::info!(
            root = %cluster.root.display(),
            base_port = cluster.opts.base_port,
            seconds = started.elapsed().as_secs_f64(),
            "chaos shards up and migrated"
        );
        Ok(cluster)
    }

    /// The folder of the worker logs.
    pub fn log_dir(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// The URL of shard `index`'s `shardq` database.
    pub fn url(&self, index: usize) -> String {
        self.servers[index].url()
    }

    /// Stops shard `index` in immediate mode (a crash: no checkpoint, clients
    /// cut off) and starts it again, which runs crash recovery. Returns how
    /// long it was down.
    pub async fn crash_restart(&self, index: usize) -> Result<Duration> {
        let server = self.servers[index].clone();
        tokio::task::spawn_blocking(move || {
            let stopped = Instant::now();
            server.stop(StopMode::Immediate)?;
            server.start()?;
            Ok(stopped.elapsed())
        })
        .await?
    }

    /// Freezes shard `index` for `hold`: every process of its server is
    /// stopped (SIGSTOP), so connections stay open and nothing answers, as
    /// when a host hangs; then they are continued (SIGCONT).
    pub async fn freeze(&self, index: usize, hold: Duration) -> Result<usize> {
        use nix::sys::signal::Signal;
        let stopped = self.servers[index].signal_all(Signal::SIGSTOP)?;
        tokio::time::sleep(hold).await;
        self.servers[index].signal_all(Signal::SIGCONT)?;
        Ok(stopped)
    }

    /// Stops the servers and deletes the folder (unless asked to keep it).
    pub fn teardown(&mut self) -> Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        let stopped = shardq::local::down(&self.opts).context("cannot stop the chaos shards");
        if self.keep {
            eprintln!("kept {}", self.root.display());
        } else if let Err(err) = fs::remove_dir_all(&self.root) {
            tracing::warn!(root = %self.root.display(), error = %err, "cannot delete the chaos folder");
        }
        stopped
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(err) = self.teardown() {
            tracing::warn!(error = format!("{err:#}"), "chaos teardown failed");
        }
    }
}

/// The shard list of `servers` followed by [`WORKER_SETTINGS`].
fn config_text(servers: &[LocalServer]) -> String {
    let mut text = String::new();
    for server in servers {
        text.push_str(&format!(
            "[[shards]]\nname = \"shard-{}\"\nurl = \"{}\"\npool_size = {POOL_SIZE}\n\n",
            server.index,
            server.url()
        ));
    }
    text.push_str(&WORKER_SETTINGS.replace("{queue}", worker::QUEUE));
    text
}

/// A fresh folder under the system temp dir, mode 0755 so that the
/// `postgres` user can reach its data folders when we run as root.
fn make_root() -> Result<PathBuf> {
    let name = format!(
        "shardq-chaos-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let root = std::env::temp_dir().join(name);
    DirBuilder::new()
        .mode(0o755)
        .create(&root)
        .with_context(|| format!("cannot create {}", root.display()))?;
    fs::set_permissions(&root, Permissions::from_mode(0o755))?;
    Ok(root)
}

/// A base port whose `count` consecutive ports were all free a moment ago.
fn free_base_port(count: usize) -> Result<u16> {
    let mut rng = rand::thread_rng();
    for _ in 0..PORT_PROBES {
        let base = rng.gen_range(PORT_RANGE);
        let listeners: Vec<_> = (0..count as u16)
            .map_while(|i| TcpListener::bind((Ipv4Addr::LOCALHOST, base + i)).ok())
            .collect();
        if listeners.len() == count {
            return Ok(base);
        }
    }
    bail!(
        "found no {count} consecutive free ports in {}..{}; pass --base-port",
        PORT_RANGE.start,
        PORT_RANGE.end
    )
}
