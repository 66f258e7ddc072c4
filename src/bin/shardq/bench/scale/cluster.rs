//! The shards a scale run uses: local servers it starts itself in a
//! temporary folder (stopped and deleted at the end), or the shards of a
//! given shards.toml. Also the per-run reset and the shards.toml written for
//! the worker processes.

use super::toml_text;
use anyhow::{bail, Context, Result};
use rand::Rng;
use shardq::config::{Config, ConfigFile};
use shardq::local::{LocalOptions, LocalServer, StopMode};
use shardq::shards::ShardSet;
use std::fs::{self, DirBuilder, Permissions};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Connections of the bench's own pool per shard (enqueuer, checks, disturbance).
const ADMIN_POOL: usize = 6;

/// Where free port ranges are looked for.
const PORT_RANGE: std::ops::Range<u16> = 20_000..32_000;

/// Empties the job tables; `lock_timeout` lifted so an autovacuum is waited out.
const RESET_SQL: &str = "BEGIN; SET LOCAL lock_timeout = 0; \
    TRUNCATE workflow_status CASCADE; COMMIT";

/// The servers (or configured shards) of the whole invocation.
pub struct Cluster {
    /// Temporary folder: data folders (local), worker configs and logs.
    pub root: PathBuf,
    /// `[[shards]]` entries (TOML, without pool_size), in routing order.
    entries: Vec<String>,
    /// The bench's own pools over every shard, without `lock_timeout`.
    pub admin: ShardSet,
    local: Option<(LocalOptions, Vec<LocalServer>)>,
    /// Leave the temporary folder behind at teardown.
    pub keep: bool,
    torn_down: bool,
}

impl Cluster {
    /// Starts `n` local servers on free loopback ports under a new temporary folder.
    pub async fn local(n: usize) -> Result<Cluster> {
        let root = make_root()?;
        let opts = LocalOptions {
            root: root.join("data"),
            base_port: free_base_port(n)?,
            shards: n,
        };
        let servers = shardq::local::servers(&opts);
        let entries = servers
            .iter()
            .map(|s| toml_text::url_entry(&format!("local-{}", s.index), &s.url()))
            .collect();
        let mut cluster = Cluster::new(root, entries)?;
        cluster.local = Some((opts.clone(), servers));
        shardq::local::up(&opts)
            .await
            .context("cannot start the local shards")?;
        Ok(cluster)
    }

    /// The shards of `path` (its other sections are ignored: the bench sets them).
    pub fn from_config(path: &Path) -> Result<Cluster> {
        use figment::providers::{Format, Toml};
        let raw: ConfigFile = figment::Figment::new()
            .merge(Toml::file(path))
            .extract()
            .map_err(|e| anyhow::anyhow!(shardq::config::redact_text(&e.to_string())))
            .with_context(|| format!("cannot read {}", path.display()))?;
        let Some(shards) = raw.shards.filter(|s| !s.is_empty()) else {
            bail!("{} lists no [[shards]]", path.display());
        };
        let entries = shards.iter().map(toml_text::shard_entry).collect();
        Cluster::new(make_root()?, entries)
    }

    fn new(root: PathBuf, entries: Vec<String>) -> Result<Cluster> {
        let text = toml_text::config(&entries, ADMIN_POOL, &[], "lock_timeout_ms = 0\n");
        let config = Config::from_toml(&text).context("the bench's shard list is invalid")?;
        Ok(Cluster {
            root,
            entries,
            admin: ShardSet::connect(&config)?,
            local: None,
            keep: false,
            torn_down: false,
        })
    }

    /// How many shards there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Writes the shards.toml of a run on the first `n` shards and returns its path.
    pub fn worker_config(
        &self,
        name: &str,
        n: usize,
        pool_size: usize,
        queue: &str,
    ) -> Result<PathBuf> {
        let text = toml_text::config(&self.entries[..n], pool_size, &[queue], "");
        Config::from_toml(&text).context("the workers' shards.toml is invalid")?;
        let path = self.root.join(format!("{name}.toml"));
        fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        fs::set_permissions(&path, Permissions::from_mode(0o600))?;
        Ok(path)
    }

    /// `ALTER DATABASE <current> SET key = 'value'` on every local shard, for
    /// the connections opened after it (the workers'). Local shards only:
    /// the setting persists in the database.
    pub async fn set_database(&self, settings: &[String]) -> Result<()> {
        if settings.is_empty() {
            return Ok(());
        }
        if self.local.is_none() {
            bail!("--db-set works on local shards only (it persists in the database)");
        }
        for setting in settings {
            let Some((key, value)) = setting.split_once('=') else {
                bail!("--db-set {setting}: write KEY=VALUE");
            };
            if key.is_empty()
                || !key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            {
                bail!("--db-set {setting}: `{key}` is not a setting name");
            }
            if value.contains('$') {
                bail!("--db-set {setting}: the value may not contain `$`");
            }
            let value = value.replace('\'', "''");
            for shard in self.admin.all() {
                let db = shard.client().await?;
                let sql = format!("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET {key} = %L', current_database(), '{value}'); END $$");
                db.batch_execute(&sql)
                    .await
                    .map_err(|e| shard.query_error(e))
                    .with_context(|| format!("--db-set {setting} failed"))?;
            }
        }
        Ok(())
    }

    /// Migrates every shard and empties its job tables.
    pub async fn reset(&self) -> Result<()> {
        shardq::migrate::migrate_all(&self.admin).await?;
        for shard in self.admin.all() {
            let db = shard.client().await?;
            db.batch_execute(RESET_SQL)
                .await
                .map_err(|e| shard.query_error(e))
                .context("cannot empty workflow_status")?;
        }
        Ok(())
    }

    /// Runs `sql` statements one by one on shard `i`.
    pub async fn execute(&self, i: usize, sql: &[&str]) -> Result<()> {
        let shard = self.admin.get(i);
        let db = shard.client().await?;
        for s in sql {
            db.batch_execute(s)
                .await
                .map_err(|e| shard.query_error(e))
                .with_context(|| format!("`{s}` failed"))?;
        }
        Ok(())
    }

    /// Stops local shard `i` at once (like a crash), keeps it down for
    /// `down`, starts it again (crash recovery). Local shards only.
    pub async fn crash_restart(&self, i: usize, down: Duration) -> Result<()> {
        let Some((_, servers)) = &self.local else {
            bail!("--disturb restart needs local shards (not --config)");
        };
        let server = servers[i].clone();
        let stopped = server.clone();
        tokio::task::spawn_blocking(move || stopped.stop(StopMode::Immediate)).await??;
        tokio::time::sleep(down).await;
        tokio::task::spawn_blocking(move || server.start()).await??;
        Ok(())
    }

    /// Freezes local server `i` for `hold` (SIGSTOP on every process of it,
    /// then SIGCONT): connections stay open and nothing answers.
    pub async fn freeze(&self, i: usize, hold: Duration) -> Result<()> {
        use nix::sys::signal::Signal;
        let Some((_, servers)) = &self.local else {
            bail!("--disturb freeze needs local shards (not --config)");
        };
        servers[i].signal_all(Signal::SIGSTOP)?;
        tokio::time::sleep(hold).await;
        servers[i].signal_all(Signal::SIGCONT)?;
        Ok(())
    }

    /// Stops local servers and deletes the temporary folder.
    pub fn teardown(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.torn_down, true) {
            return Ok(());
        }
        self.admin.close();
        let stopped = match &self.local {
            Some((opts, _)) => shardq::local::down(opts).context("cannot stop the local shards"),
            None => Ok(()),
        };
        if self.keep {
            eprintln!("kept {}", self.root.display());
        } else if let Err(err) = fs::remove_dir_all(&self.root) {
            tracing::warn!(root = %self.root.display(), error = %err, "cannot delete the bench folder");
        }
        stopped
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(err) = self.teardown() {
            tracing::warn!(error = format!("{err:#}"), "bench teardown failed");
        }
    }
}

/// A fresh folder under the system temp dir, mode 0755 so that the
/// `postgres` user can reach the data folders when we run as root.
fn make_root() -> Result<PathBuf> {
    let name = format!(
        "shardq-scale-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let root = std::env::temp_dir().join(name);
    DirBuilder::new()
        .mode(0o755)
        .recursive(true)
        .create(root.join("logs"))
        .with_context(|| format!("cannot create {}", root.display()))?;
    fs::set_permissions(&root, Permissions::from_mode(0o755))?;
    Ok(root)
}

/// A base port whose `count` consecutive ports were all free a moment ago.
fn free_base_port(count: usize) -> Result<u16> {
    let mut rng = rand::thread_rng();
    for _ in 0..50 {
        let base = rng.gen_range(PORT_RANGE);
        let free = (0..count as u16)
            .map_while(|i| TcpListener::bind((Ipv4Addr::LOCALHOST, base + i)).ok())
            .count();
        if free == count {
            return Ok(base);
        }
    }
    bail!("found no {count} consecutive free ports in {PORT_RANGE:?}")
}
