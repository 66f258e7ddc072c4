//! The cluster under test: fresh local PostgreSQL servers in a temporary
//! folder, migrated, with the `shards.toml` that the chaos workers read. It is
//! stopped and deleted at the end, also when the run fails.

use super::{sql, worker};
use anyhow::{Context, Result};
use shardq::config::Config;
use shardq::local::LocalServer;
use shardq::shards::ShardSet;
use shardq_harness::LocalCluster;
use std::fs;
use std::path::PathBuf;
use std::time::Duration;

/// Servers (shards) of the chaos cluster.
pub const SHARDS: usize = 4;

/// Names the temporary folder.
const ROOT_PREFIX: &str = "shardq-chaos";

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
    /// The config file the workers read.
    pub config_path: PathBuf,
    /// The same config, parsed.
    pub config: Config,
    local: LocalCluster,
}

impl Cluster {
    /// Starts [`SHARDS`] servers on `base_port..` (or free ports), migrates
    /// them and creates the side-effect table. Whatever was started is torn
    /// down again when this fails.
    pub async fn start(base_port: Option<u16>, keep: bool) -> Result<Cluster> {
        let mut local = LocalCluster::start(ROOT_PREFIX, SHARDS, base_port)
            .await
            .context("cannot start the chaos shards")?;
        local.keep(keep);
        let text = config_text(local.servers());
        let config = Config::from_toml(&text).context("the chaos config is invalid")?;
        let config_path = local.root().path().join("shards.toml");
        fs::write(&config_path, text)
            .with_context(|| format!("cannot write {}", config_path.display()))?;
        let shards = ShardSet::connect(&config)?;
        shardq::migrate::migrate_all(&shards).await?;
        for shard in shards.all() {
            let db = shard.client().await?;
            db.batch_execute(sql::EFFECTS_CREATE)
                .await
                .map_err(|e| shard.query_error(e))?;
        }
        Ok(Cluster {
            config_path,
            config,
            local,
        })
    }

    /// The folder of the worker logs.
    pub fn log_dir(&self) -> PathBuf {
        self.local.root().log_dir()
    }

    /// The URL of shard `index`'s `shardq` database.
    pub fn url(&self, index: usize) -> String {
        self.local.url(index)
    }

    /// Stops shard `index` in immediate mode (a crash: no checkpoint, clients
    /// cut off) and starts it again at once, which runs crash recovery.
    /// Returns how long it was down.
    pub async fn crash_restart(&self, index: usize) -> Result<Duration> {
        self.local.crash_restart(index, Duration::ZERO).await
    }

    /// Freezes shard `index` for `hold` (every process of its server stopped,
    /// as when a host hangs). Returns how many processes were stopped.
    pub async fn freeze(&self, index: usize, hold: Duration) -> Result<usize> {
        self.local.freeze(index, hold).await
    }

    /// Stops the servers; the folder goes (unless kept) when the cluster is dropped.
    pub fn teardown(&mut self) -> Result<()> {
        self.local.teardown()
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
