//! `[database]`: the timeouts every connection and statement obeys, read
//! from their own section or, deprecated, from `[dequeue]` where they were.

use super::super::error::ConfigError;
use super::super::file::{
    DatabaseFile, DequeueFile, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_LOCK_TIMEOUT_MS,
    DEFAULT_STATEMENT_TIMEOUT_MS,
};
use super::checks::positive;
use std::time::Duration;

/// Connection and statement settings, checked.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// Server-side lock wait limit (`database.lock_timeout_ms`; zero: none).
    pub lock_timeout: Duration,
    /// Connect timeout (`database.connect_timeout_ms`).
    pub connect_timeout: Duration,
    /// Deadline of one statement, server and client side
    /// (`database.statement_timeout_ms`).
    pub statement_timeout: Duration,
}

/// The three settings in milliseconds, before the range checks.
pub(super) struct DatabaseMs {
    pub lock_timeout: u64,
    pub connect_timeout: u64,
    pub statement_timeout: u64,
}

/// Each setting from `[database]`, else from its deprecated `[dequeue]` key
/// (with a warning naming the new key), else its default.
pub(super) fn database_ms(
    new: &DatabaseFile,
    old: &DequeueFile,
) -> Result<DatabaseMs, ConfigError> {
    Ok(DatabaseMs {
        lock_timeout: one(
            "database.lock_timeout_ms",
            new.lock_timeout_ms,
            "dequeue.lock_timeout_ms",
            old.lock_timeout_ms,
        )?
        .unwrap_or(DEFAULT_LOCK_TIMEOUT_MS),
        connect_timeout: one(
            "database.connect_timeout_ms",
            new.connect_timeout_ms,
            "dequeue.connect_timeout_ms",
            old.connect_timeout_ms,
        )?
        .unwrap_or(DEFAULT_CONNECT_TIMEOUT_MS),
        statement_timeout: one(
            "database.statement_timeout_ms",
            new.statement_timeout_ms,
            "dequeue.statement_timeout_ms",
            old.statement_timeout_ms,
        )?
        .unwrap_or(DEFAULT_STATEMENT_TIMEOUT_MS),
    })
}

pub(super) fn database(ms: &DatabaseMs) -> Result<DatabaseConfig, ConfigError> {
    Ok(DatabaseConfig {
        lock_timeout: Duration::from_millis(ms.lock_timeout),
        connect_timeout: Duration::from_millis(positive(
            "database.connect_timeout_ms",
            ms.connect_timeout as usize,
        )? as u64),
        statement_timeout: Duration::from_millis(positive(
            "database.statement_timeout_ms",
            ms.statement_timeout as usize,
        )? as u64),
    })
}

/// The value of `key`, or of its deprecated name `old_key`; both given
/// must agree (two values would leave the reader guessing which one runs).
fn one(
    key: &'static str,
    value: Option<u64>,
    old_key: &'static str,
    old: Option<u64>,
) -> Result<Option<u64>, ConfigError> {
    match (value, old) {
        (Some(new), Some(old)) if new != old => Err(ConfigError::Deprecated {
            key,
            value: new,
            old_key,
            old_value: old,
        }),
        (Some(new), _) => Ok(Some(new)),
        (None, Some(old)) => {
            tracing::warn!(
                deprecated = old_key,
                use_instead = key,
                "`{old_key}` is deprecated: it governs every statement, not only dequeues; \
                 write it as `{key}` (in [database])"
            );
            Ok(Some(old))
        }
        (None, None) => Ok(None),
    }
}
