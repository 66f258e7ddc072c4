//! Range checks the validators share.

use super::super::error::ConfigError;

/// `value` when it is at least 1; else the error naming `key`.
pub(super) fn positive(key: &'static str, value: usize) -> Result<usize, ConfigError> {
    if value == 0 {
        return Err(ConfigError::Invalid {
            key,
            value: "0".into(),
            fix: "must be at least 1",
        });
    }
    Ok(value)
}
