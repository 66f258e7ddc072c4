//! The shards a scale run uses: local servers it starts itself in a
//! temporary folder (stopped and deleted at the end), or the shards of a
//! given shards.toml. Also the per-run reset and the shards.toml written for
//! the worker processes.

use super::toml_text;
use anyhow::{bail, Context, Result};
use shardq::config::{Config, ConfigFile};
use shardq::shards::ShardSet;
use shardq_harness::{LocalCluster, TempRoot};
use std::fs::{self, Permissions};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Connections of the bench's own pool per shard (enqueuer, checks, disturbance).
/// Forgets a migrated shard's place and map (its jobs are emptied next):
/// the next `migrate` records them for the list it is given. A shard not
/// migrated yet has nothing to forget.
const FORGET_MAP_SQL: &str = "DO $$ BEGIN \
    IF to_regclass('shardq_map_epochs') IS NOT NULL THEN \
        DELETE FROM shardq_map_moves; DELETE FROM shardq_map_ranges; \
        DELETE FROM shardq_map_epochs; \
    END IF; \
    IF to_regclass('shardq_shard_map') IS NOT NULL THEN DELETE FROM shardq_shard_map; END IF; \
    END $$";

const ADMIN_POOL: usize = 6;

/// Names the temporary folder.
const ROOT_PREFIX: &str = "shardq-scale";

/// The servers (or configured shards) of the whole invocation.
pub struct Cluster {
    /// `[[shards]]` entries (TOML, without pool_size), in routing order.
    entries: Vec<String>,
    /// The bench's own pools over every shard, without `lock_timeout`.
    pub admin: ShardSet,
    /// Local servers (with the temporary folder), or only the folder.
    place: Place,
    torn_down: bool,
}

/// Where the shards are, and the temporary folder: worker configs and logs
/// (and the data folders of local servers).
enum Place {
    Local(LocalCluster),
    Configured(TempRoot),
}

impl Cluster {
    /// Starts `n` local servers on free loopback ports under a new temporary folder.
    pub async fn local(n: usize) -> Result<Cluster> {
        let local = LocalCluster::start(ROOT_PREFIX, n, None).await?;
        let entries = local
            .servers()
            .iter()
            .map(|s| toml_text::url_entry(&format!("local-{}", s.index), &s.url()))
            .collect();
        Cluster::new(Place::Local(local), entries)
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
        Cluster::new(Place::Configured(TempRoot::new(ROOT_PREFIX)?), entries)
    }

    fn new(place: Place, entries: Vec<String>) -> Result<Cluster> {
        let text = toml_text::config(&entries, ADMIN_POOL, &[], "lock_timeout_ms = 0\n");
        let config = Config::from_toml(&text).context("the bench's shard list is invalid")?;
        Ok(Cluster {
            entries,
            admin: ShardSet::connect(&config)?,
            place,
            torn_down: false,
        })
    }

    /// The temporary folder.
    pub fn root(&self) -> &Path {
        self.temp().path()
    }

    fn temp(&self) -> &TempRoot {
        match &self.place {
            Place::Local(local) => local.root(),
            Place::Configured(root) => root,
        }
    }

    /// The folder of the worker logs.
    pub fn log_dir(&self) -> PathBuf {
        self.temp().log_dir()
    }

    /// Leave the temporary folder behind at teardown.
    pub fn keep(&mut self, keep: bool) {
        match &mut self.place {
            Place::Local(local) => local.keep(keep),
            Place::Configured(root) => root.keep = keep,
        }
    }

    /// The local servers, or an error naming `what` needs them.
    fn servers(&self, what: &str) -> Result<&LocalCluster> {
        match &self.place {
            Place::Local(local) => Ok(local),
            Place::Configured(_) => bail!("{what} needs local shards (not --config)"),
        }
    }

    /// How many shards there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Where local shard `i`'s server listens (what a proxy in front of it
    /// forwards to). Local shards only.
    pub fn upstream(&self, i: usize, what: &str) -> Result<SocketAddr> {
        let server = &self.servers(what)?.servers()[i];
        Ok(([127, 0, 0, 1], server.port).into())
    }

    /// Writes the shards.toml of a run on the first `n` shards and returns
    /// its path; with `via = Some((i, port))` the workers reach local shard
    /// `i` on 127.0.0.1:`port` (a proxy) instead.
    pub fn worker_config(
        &self,
        name: &str,
        n: usize,
        pool_size: usize,
        queue: &str,
        via: Option<(usize, u16)>,
    ) -> Result<PathBuf> {
        let mut entries = self.entries[..n].to_vec();
        if let Some((i, port)) = via {
            let mut server = self.servers("a proxied shard")?.servers()[i].clone();
            server.port = port;
            entries[i] = toml_text::url_entry(&format!("local-{}", server.index), &server.url());
        }
        let text = toml_text::config(&entries, pool_size, &[queue], "");
        Config::from_toml(&text).context("the workers' shards.toml is invalid")?;
        let path = self.root().join(format!("{name}.toml"));
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
        self.servers("--db-set (it persists in the database)")?;
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

    /// Makes the first `n` shards the shard list of a run: each forgets
    /// its recorded place and map, is migrated as one of `n` (so its map
    /// records `n` shards: a run on fewer shards than the bench started
    /// would otherwise find its keys mapped to shards it does not use, and
    /// every insert refused), and has its job tables emptied.
    /// Every shard is migrated (as one of all) first, so that every table
    /// the bench reads exists on each.
    pub async fn reset(&self, n: usize) -> Result<()> {
        self.forget_map(self.admin.len()).await?;
        shardq::migrate::migrate_all(&self.admin).await?;
        self.forget_map(n).await?;
        let text = toml_text::config(&self.entries[..n], ADMIN_POOL, &[], "lock_timeout_ms = 0\n");
        let first = ShardSet::connect(&Config::from_toml(&text)?)?;
        shardq::migrate::migrate_all(&first).await?;
        for shard in first.all() {
            shardq_harness::reset(shard).await?;
        }
        first.close();
        Ok(())
    }

    async fn forget_map(&self, n: usize) -> Result<()> {
        for shard in self.admin.all().iter().take(n) {
            shard
                .client()
                .await?
                .batch_execute(FORGET_MAP_SQL)
                .await
                .map_err(|e| shard.query_error(e))
                .context("cannot forget the shard map")?;
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
        let local = self.servers("--disturb restart")?;
        local.crash_restart(i, down).await?;
        Ok(())
    }

    /// Freezes local server `i` for `hold` (SIGSTOP on every process of it,
    /// then SIGCONT): connections stay open and nothing answers.
    pub async fn freeze(&self, i: usize, hold: Duration) -> Result<()> {
        self.servers("--disturb freeze")?.freeze(i, hold).await?;
        Ok(())
    }

    /// Closes the pools and stops local servers; the temporary folder goes
    /// when the cluster is dropped.
    pub fn teardown(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.torn_down, true) {
            return Ok(());
        }
        self.admin.close();
        match &mut self.place {
            Place::Local(local) => local.teardown(),
            Place::Configured(_) => Ok(()),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(err) = self.teardown() {
            tracing::warn!(error = format!("{err:#}"), "bench teardown failed");
        }
    }
}
