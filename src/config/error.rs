//! The error of loading a configuration: names the key at fault and says
//! what to fix. A leaf below the file's keys and their checks.

use crate::tls::TlsError;
use std::path::PathBuf;

/// A configuration error: names the key at fault and says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file named by `--config` does not exist.
    #[error(
        "config file {0} does not exist; pass an existing file with --config or SHARDQ_CONFIG"
    )]
    MissingFile(PathBuf),
    /// [`Config::load`](super::Config::load) was given no file and found no
    /// `shards.toml` in the working directory.
    #[error(
        "no shards.toml in {0} and no file given: pass one (--config or SHARDQ_CONFIG), \
         or ask for the local shards `shardq local up` starts with Config::local()"
    )]
    NoConfigFile(PathBuf),
    /// TOML syntax, an unknown key, or a value of the wrong type. Holds the
    /// parser's message with secrets redacted (the parser quotes the offending
    /// line, which may hold a password), not the parser error itself.
    #[error("invalid configuration: {0}")]
    Parse(String),
    /// `shards = []`.
    #[error("`shards` is empty: list at least one [[shards]] entry, or remove the key to use the local shards")]
    NoShards,
    /// Two shards share a name.
    #[error("shards: the name `{0}` is used twice; give every shard a unique name")]
    DuplicateShard(String),
    /// A shard URL that does not parse.
    #[error("shards[{index}].url (shard `{name}`) is not a valid connection URL; write it as postgres://user:password@host:port/dbname")]
    BadUrl {
        /// Position in the list.
        index: usize,
        /// Shard name.
        name: String,
        /// Parser error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A shard with both or neither of `url` and `host`.
    #[error("shards[{index}] (shard `{name}`): give either `url` or `host` (with port, dbname, user), not {what}")]
    Address {
        /// Position in the list.
        index: usize,
        /// Shard name.
        name: String,
        /// "both" or "neither".
        what: &'static str,
    },
    /// A password file that cannot be read.
    #[error("shards[{index}].password_file {path}: cannot read it")]
    PasswordFile {
        /// Position in the list.
        index: usize,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `password_env` names a variable that is unset or not UTF-8.
    #[error("shards[{index}].password_env (shard `{name}`): the environment variable `{var}` is {problem}; export it before starting shardq, or remove the key")]
    PasswordEnv {
        /// Position in the list.
        index: usize,
        /// Shard name.
        name: String,
        /// The variable's name (never its value).
        var: String,
        /// "not set" or "not valid UTF-8".
        problem: &'static str,
    },
    /// A shard's password comes from two places (`url`, `password`,
    /// `password_file`, `password_env`).
    #[error("shards[{index}] (shard `{name}`): the password is given by both `{first}` and `{second}`; keep one of them")]
    PasswordTwice {
        /// Position in the list.
        index: usize,
        /// Shard name.
        name: String,
        /// One source.
        first: &'static str,
        /// The other.
        second: &'static str,
    },
    /// TLS settings of a shard that cannot work together.
    #[error("shards[{index}].{key} (shard `{name}`): {problem}")]
    Tls {
        /// Position in the list.
        index: usize,
        /// Shard name.
        name: String,
        /// `sslmode` or `sslrootcert`.
        key: &'static str,
        /// What is wrong and what to do.
        problem: String,
    },
    /// A `sslrootcert` file that cannot be used.
    #[error("shards[{index}].sslrootcert {path} (shard `{name}`): cannot use it as the CA file; give the PEM file of the CA that signed the server's certificate")]
    RootCert {
        /// Position in the list.
        index: usize,
        /// Shard name.
        name: String,
        /// The file.
        path: PathBuf,
        /// Why (boxed: rustls errors are large, and errors travel by value).
        #[source]
        source: Box<TlsError>,
    },
    /// A `[[schedules]]` entry that cannot work: a bad cron expression, an
    /// unknown time zone or policy, a name used twice, a job that would be refused.
    #[error("schedules[{index}].{key} (schedule `{name}`) is invalid")]
    Schedule {
        /// Position in the list.
        index: usize,
        /// Schedule name.
        name: String,
        /// The key at fault (`cron`, `timezone`, `missed`, `name`, ...).
        key: &'static str,
        /// What is wrong and what to do.
        #[source]
        source: crate::schedule::ScheduleError,
    },
    /// A setting given both under its name and under its deprecated name,
    /// with two values.
    #[error(
        "{key} = {value} and the deprecated {old_key} = {old_value} disagree: \
         keep {key} and remove {old_key}"
    )]
    Deprecated {
        /// The key, e.g. `database.statement_timeout_ms`.
        key: &'static str,
        /// Its value.
        value: u64,
        /// The deprecated key, e.g. `dequeue.statement_timeout_ms`.
        old_key: &'static str,
        /// Its value.
        old_value: u64,
    },
    /// A numeric setting out of range, or settings that contradict each other.
    #[error("{key} = {value}: {fix}")]
    Invalid {
        /// The key, e.g. `dequeue.slots_per_shard`.
        key: &'static str,
        /// Its value as given.
        value: String,
        /// What to do instead.
        fix: &'static str,
    },
}
