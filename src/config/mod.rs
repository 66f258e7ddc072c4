//! Configuration: `shards.toml` merged with `SHARDQ_*` environment variables,
//! validated once into typed values.
//!
//! Environment variables name nested keys with `__`, e.g.
//! `SHARDQ_DEQUEUE__SLOTS_PER_SHARD=4` or `SHARDQ_WORKER__CONCURRENCY=32`.

mod builder;
mod error;
mod file;
#[cfg_attr(not(feature = "internal"), allow(unreachable_pub))]
mod redact;
mod validate;

pub use builder::ConfigBuilder;
// For shardq's own tools (the benchmarks' reports), behind the `internal`
// feature (see `lib.rs`).
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use redact::{redact_text, redact_url};
pub(crate) use validate::CLAIM_BUDGET_MIN;

// The file's serde shape, for shardq's own tools (the benchmarks write
// shard lists with it): an embedder builds a `Config` (`Config::builder`).
#[doc(hidden)]
pub use file::{
    ConfigFile, DatabaseFile, DequeueFile, DequeueModeFile, LimitsFile, LocalFile, RetentionFile,
    ScheduleFile, ShardFile, WorkerFile,
};
pub use validate::{
    Backoff, Config, ConfigError, DatabaseConfig, DequeueConfig, DequeueMode, LocalConfig,
    Retention, ShardConfig, SlotBounds, WorkerConfig,
};

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use std::path::Path;

/// The file [`Config::load`] reads when given none.
pub const DEFAULT_CONFIG_PATH: &str = "shards.toml";

/// The name [`Config::single`] gives its shard (in logs and `shardq status`).
pub const SINGLE_SHARD_NAME: &str = "shard0";

/// The `SHARDQ_*` variables that are configuration. Only nested keys
/// (`SECTION__FIELD`) are; other SHARDQ_* variables (SHARDQ_CONFIG,
/// SHARDQ_PG_BIN) belong to the CLI.
fn shardq_env() -> Env {
    Env::prefixed("SHARDQ_")
        .filter(|key| key.as_str().contains("__"))
        .split("__")
}

impl Config {
    /// Loads `path` (or, given none, `shards.toml` in the working
    /// directory), merges `SHARDQ_*` variables over it, and validates the
    /// result.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] names the key at fault and says what to fix; with no
    /// `path` and no `shards.toml`, [`ConfigError::NoConfigFile`]: a
    /// process must not quietly turn to localhost. [`Config::local`] asks
    /// for the local shards.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let path = match path {
            Some(path) if !path.exists() => {
                return Err(ConfigError::MissingFile(path.to_path_buf()))
            }
            Some(path) => path,
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => Path::new(DEFAULT_CONFIG_PATH),
            None => {
                let here = std::env::current_dir().unwrap_or_default();
                return Err(ConfigError::NoConfigFile(here));
            }
        };
        Self::from_figment(Figment::new().merge(Toml::file(path)).merge(shardq_env()))
    }

    /// The local shards that `shardq local up` starts (`[local]`: 4 servers
    /// on ports 54330–54333 by default), with `SHARDQ_*` variables merged
    /// over them: for a demo or a test on this machine.
    ///
    /// # Errors
    ///
    /// As [`Config::load`], for a bad `SHARDQ_*` variable.
    pub fn local() -> Result<Config, ConfigError> {
        Self::from_figment(Figment::new().merge(shardq_env()))
    }

    /// Parses a TOML document, merges `SHARDQ_*` variables over it (as
    /// [`Config::load`] does over the file), and validates the result.
    ///
    /// # Errors
    ///
    /// As [`Config::load`].
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Self::from_figment(Figment::new().merge(Toml::string(text)).merge(shardq_env()))
    }

    /// One shard, named `shard0`, at `url` (`postgres://user[:password]@host:port/dbname`);
    /// every other setting its default. For more, see [`Config::builder`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::BadUrl`] when the URL does not parse.
    pub fn single(url: impl Into<String>) -> Result<Config, ConfigError> {
        Config::builder().shard(SINGLE_SHARD_NAME, url).build()
    }

    /// A builder over the defaults: shards and settings set in code.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    fn from_figment(figment: Figment) -> Result<Config, ConfigError> {
        let raw: ConfigFile = figment
            .extract()
            .map_err(|e| ConfigError::Parse(redact::redact_text(&e.to_string())))?;
        validate::validate(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_url_hides_only_the_password() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/q"),
            "postgres://app:<redacted>@db:5432/q"
        );
        assert_eq!(
            redact_url("postgres://app@db:5432/q"),
            "postgres://app@db:5432/q"
        );
        assert_eq!(redact_url("host=db"), "host=db");
    }

    #[test]
    fn redact_text_hides_passwords_in_quoted_lines() {
        let text = "3 | url = \"postgres://u:pw@h:5432/db\"\n4 | password = \"hunter2\"";
        let out = redact_text(text);
        assert!(!out.contains("pw@") && !out.contains("hunter2"), "{out}");
        assert!(out.contains("postgres://u:<redacted>@h:5432/db"), "{out}");
    }
}
