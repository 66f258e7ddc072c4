//! The cluster under test: fresh local PostgreSQL servers in a temporary
//! folder, migrated, with the `shards.toml` that the chaos workers read. The
//! workers reach each server through a [`LossyProxy`], which loses replies
//! after commits while the lost-replies fault runs, and delays, silences or
//! refuses one shard's traffic during a wire fault. It is stopped and deleted
//! at the end, also when the run fails.

use super::profile::Profile;
use super::schedule::WireFault;
use super::sql;
use anyhow::{Context, Result};
use shardq::config::Config;
use shardq::shards::ShardSet;
use shardq_harness::lossy_proxy::{Fault as ProxyFault, LossyProxy};
use shardq_harness::{LocalCluster, ShardList};
use shardq_local::LocalServer;
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

/// Worker settings of the chaos fleet, appended to the shard list; the
/// placeholders come from the profile's [`super::profile::Tuning`].
const WORKER_SETTINGS: &str = r#"
[database]
connect_timeout_ms = 2000
# A frozen shard's statements give up within a second.
statement_timeout_ms = 1000
[dequeue]
# A restarted shard is retried within a second, not after up to 10 s.
unhealthy_backoff_max_ms = 1000
{dequeue_extra}
[worker]
queues = {queues}
# The chaos run's short leases bring a killed worker's jobs back within ~2 s.
lease_ms = {lease_ms}
maintenance_interval_ms = {maintenance_ms}
# An attempt that failed because its connection was killed retries soon.
retry_backoff_min_ms = 100
retry_backoff_max_ms = 2000
shutdown_grace_ms = 5000
{worker_extra}"#;

/// The servers, their folder and the config that points at them.
pub struct Cluster {
    /// The config file the workers read (shards behind the proxies).
    pub config_path: PathBuf,
    /// The same settings with the servers' own URLs, for the enqueuer and
    /// the checks (no reply of theirs is lost).
    pub config: Config,
    proxies: Vec<LossyProxy>,
    local: LocalCluster,
}

impl Cluster {
    /// Starts [`SHARDS`] servers on `base_port..` (or free ports), migrates
    /// them and creates the side-effect table. Whatever was started is torn
    /// down again when this fails.
    pub async fn start(base_port: Option<u16>, keep: bool, profile: Profile) -> Result<Cluster> {
        let mut local = LocalCluster::start(ROOT_PREFIX, SHARDS, base_port)
            .await
            .context("cannot start the chaos shards")?;
        local.keep(keep);
        let direct: Vec<String> = local.servers().iter().map(LocalServer::url).collect();
        let text = config_text(&direct, profile);
        let config = Config::from_toml(&text).context("the chaos config is invalid")?;
        let proxies: Vec<LossyProxy> = local
            .servers()
            .iter()
            .map(|s| LossyProxy::start(([127, 0, 0, 1], s.port).into()))
            .collect();
        let proxied: Vec<String> = local
            .servers()
            .iter()
            .zip(&proxies)
            .map(|(s, p)| {
                s.url()
                    .replace(&format!(":{}/", s.port), &format!(":{}/", p.addr().port()))
            })
            .collect();
        let config_path = local.root().path().join("shards.toml");
        fs::write(&config_path, config_text(&proxied, profile))
            .with_context(|| format!("cannot write {}", config_path.display()))?;
        let shards = ShardSet::connect(&config)?;
        shardq::migrate::migrate_all(&shards).await?;
        for shard in shards.all() {
            let db = shard.client().await?;
            for table in [
                sql::EFFECTS_CREATE,
                sql::RUNS_CREATE,
                sql::WAIT_EFFECTS_CREATE,
            ] {
                db.batch_execute(table)
                    .await
                    .map_err(|e| shard.query_error(e))?;
            }
        }
        Ok(Cluster {
            config_path,
            config,
            proxies,
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

    /// Sets the chance that a worker loses the reply to a statement that
    /// committed (its connection closes instead), on every shard.
    pub fn lose_replies(&self, probability: f64) {
        self.proxies
            .iter()
            .for_each(|p| p.set_drop_probability(probability));
    }

    /// Makes the proxy in front of shard `index` misbehave (`None`: behave).
    pub fn wire_fault(&self, index: usize, fault: Option<WireFault>) {
        self.proxies[index].set_fault(match fault {
            None => ProxyFault::None,
            Some(WireFault::Slow(by)) => ProxyFault::Delay(by),
            Some(WireFault::Silent) => ProxyFault::Silent,
            Some(WireFault::Refuse) => ProxyFault::Refuse,
        });
    }

    /// Replies lost so far, over every shard.
    pub fn replies_lost(&self) -> u64 {
        self.proxies.iter().map(LossyProxy::dropped).sum()
    }

    /// Stops the servers; the folder goes (unless kept) when the cluster is dropped.
    pub fn teardown(&mut self) -> Result<()> {
        self.local.teardown()
    }
}

/// The shards at `urls` followed by [`WORKER_SETTINGS`] for `profile`.
fn config_text(urls: &[String], profile: Profile) -> String {
    let mut text = urls
        .iter()
        .enumerate()
        .fold(ShardList::default(), |list, (index, url)| {
            list.shard(format!("shard-{index}"), url)
        })
        .pool_size(POOL_SIZE)
        .toml("");
    let tuning = profile.tuning();
    let (dequeue_extra, worker_extra) = match tuning.small_buffers {
        Some((buffer, batch)) => (
            format!("batch_size = {batch}\n"),
            format!("buffer_jobs = {buffer}\n"),
        ),
        None => (String::new(), String::new()),
    };
    let queues = serde_json::to_string(profile.served_queues()).expect("queue names");
    text.push_str(
        &WORKER_SETTINGS
            .replace("{dequeue_extra}", &dequeue_extra)
            .replace("{worker_extra}", &worker_extra)
            .replace("{queues}", &queues)
            .replace("{lease_ms}", &tuning.lease_ms.to_string())
            .replace(
                "{maintenance_ms}",
                &tuning.maintenance_interval_ms.to_string(),
            ),
    );
    text
}
