//! A [`Config`] made in code, without a TOML string to splice URLs into.

use super::file::{ConfigFile, ShardFile};
use super::validate::{self, Config, ConfigError};

/// Builds a [`Config`] from values set in code; every setting not set keeps
/// its default, and [`ConfigBuilder::build`] checks the whole as
/// [`Config::load`] does. `SHARDQ_*` variables are not read: what the code
/// sets is what runs.
///
/// ```
/// use shardq::Config;
/// let config = Config::builder()
///     .shard("eu-0", "postgres://app@db-0:5432/jobs")
///     .shard("eu-1", "postgres://app@db-1:5432/jobs")
///     .queues(["emails"])
///     .set(|file| file.worker.concurrency = 32)
///     .build()?;
/// assert_eq!(config.shards.len(), 2);
/// assert_eq!(config.worker.concurrency, 32);
/// # Ok::<(), shardq::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct ConfigBuilder {
    file: ConfigFile,
}

impl ConfigBuilder {
    /// Appends a shard reached at `url` (`postgres://user[:password]@host:port/dbname`,
    /// `?sslmode=` and `?sslrootcert=` as in `shards.toml`). The order of the
    /// calls is the shard map's order.
    pub fn shard(mut self, name: impl Into<String>, url: impl Into<String>) -> Self {
        self.file
            .shards
            .get_or_insert_with(Vec::new)
            .push(ShardFile::from_url(name, url));
        self
    }

    /// The queues a worker serves (`worker.queues`).
    pub fn queues<I, S>(mut self, queues: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.file.worker.queues = queues.into_iter().map(Into::into).collect();
        self
    }

    /// Any other setting, on the raw file as `shards.toml` would give it
    /// (same names, same units), e.g.
    /// `.set(|f| f.database.statement_timeout_ms = Some(5_000))`.
    pub fn set(mut self, edit: impl FnOnce(&mut ConfigFile)) -> Self {
        edit(&mut self.file);
        self
    }

    /// Checks and returns the configuration. With no shard given, the
    /// local shards of `[local]` are used, as in a file without `[[shards]]`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`], naming the key at fault and what to fix.
    pub fn build(self) -> Result<Config, ConfigError> {
        validate::validate(self.file)
    }
}
