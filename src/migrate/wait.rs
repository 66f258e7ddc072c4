//! Migrating shards whose servers are still starting.

use super::error::MigrateError;
use super::run::migrate_all;
use crate::shards::{ShardError, ShardSet};

/// First pause between tries of [`migrate_all_within`]: a server that is
/// starting takes about a second, so a few tries see it up soon after.
const READY_FIRST_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);
/// Longest pause between tries, so an operator's server start is seen soon.
const READY_MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(2);

/// [`migrate_all`](super::migrate_all), waiting up to `wait` for shards that do not accept
/// connections yet (refused, reset, or "the database system is starting
/// up", 57P03): for a service that starts beside its database. Any other
/// error (a refused password, a missing database, a shard map that
/// disagrees) is returned at once: waiting would not change it.
///
/// # Errors
///
/// [`MigrateError::NotReady`] when a shard still refused connections after
/// `wait`; otherwise as [`migrate_all`](super::migrate_all).
///
/// # Cancel safety
///
/// As [`migrate_all`](super::migrate_all).
pub async fn migrate_all_within(
    shards: &ShardSet,
    wait: std::time::Duration,
) -> Result<Vec<Vec<i32>>, MigrateError> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut pause = READY_FIRST_PAUSE;
    loop {
        let source = match migrate_all(shards).await {
            Err(MigrateError::Shard(e)) if not_accepting_yet(&e) => e,
            other => return other,
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(MigrateError::NotReady {
                waited: wait,
                source,
            });
        }
        tracing::info!(error = %crate::error_chain(&source), "a shard does not accept connections yet; waiting");
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(READY_MAX_PAUSE);
    }
}

/// Whether a connection failed the way a server that is down or starting
/// fails it: no SQLSTATE (refused, reset, connect timeout) or 57P03.
fn not_accepting_yet(e: &ShardError) -> bool {
    use deadpool_postgres::PoolError;
    use tokio_postgres::error::SqlState;
    match e {
        ShardError::Connect { source, .. } => match source {
            PoolError::Backend(pg) => pg
                .code()
                .is_none_or(|code| *code == SqlState::CANNOT_CONNECT_NOW),
            PoolError::Timeout(_) => true,
            _ => false,
        },
        _ => false,
    }
}
