//! A queue's recent failures grouped by error ([`sql::FAILURES_BY_ERROR`]).

use super::exec;
use super::sql;
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use std::time::Duration;
use tokio_postgres::types::Type;

/// Dead or failed jobs of one queue whose errors read alike: the same first
/// line once digits are folded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorGroup {
    /// The error's first line with every run of digits written `N`.
    pub kind: String,
    /// How many jobs ended with it.
    pub jobs: i64,
    /// The newest one's end, in µs since the Unix epoch.
    pub last_us: i64,
    /// The newest one's error, whole (at most 1,000 characters).
    pub error: String,
    /// The newest one.
    pub example: JobId,
}

/// The dead and failed jobs of `queue` on `shard` that finished within the
/// last `within`, at most `limit` of them (the newest), grouped by error.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn by_error(
    shard: &Shard,
    queue: &str,
    within: Duration,
    limit: i64,
) -> Result<Vec<ErrorGroup>, ShardError> {
    let seconds = within.as_secs().max(1) as i64;
    let rows = exec::query(
        shard,
        sql::FAILURES_BY_ERROR,
        &[
            (&queue, Type::TEXT),
            (&seconds, Type::INT8),
            (&limit, Type::INT8),
        ],
    )
    .await?;
    Ok(rows
        .iter()
        .map(|r| ErrorGroup {
            kind: r.get("kind"),
            jobs: r.get("n"),
            last_us: r.get("last_us"),
            error: r.get("error"),
            example: JobId {
                shard_key: r.get("shard_key"),
                id: r.get("id"),
            },
        })
        .collect())
}

/// Groups of several shards as one list: a kind's jobs summed, its newest
/// example kept; most jobs first, then the newest.
pub fn merge(groups: impl IntoIterator<Item = ErrorGroup>) -> Vec<ErrorGroup> {
    let mut by_kind: std::collections::HashMap<String, ErrorGroup> = Default::default();
    for g in groups {
        match by_kind.get_mut(&g.kind) {
            Some(seen) => {
                seen.jobs += g.jobs;
                if g.last_us > seen.last_us {
                    let jobs = seen.jobs;
                    *seen = ErrorGroup { jobs, ..g };
                }
            }
            None => {
                by_kind.insert(g.kind.clone(), g);
            }
        }
    }
    let mut out: Vec<ErrorGroup> = by_kind.into_values().collect();
    out.sort_by(|a, b| b.jobs.cmp(&a.jobs).then(b.last_us.cmp(&a.last_us)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(kind: &str, jobs: i64, last_us: i64, id: i64) -> ErrorGroup {
        ErrorGroup {
            kind: kind.into(),
            jobs,
            last_us,
            error: format!("{kind} #{id}"),
            example: JobId { shard_key: 0, id },
        }
    }

    #[test]
    fn a_kind_over_shards_is_summed_with_its_newest_example() {
        let merged = merge([
            group("timeout", 2, 10, 1),
            group("bad payload", 3, 5, 2),
            group("timeout", 4, 20, 3),
        ]);
        assert_eq!(merged.len(), 2);
        assert_eq!((merged[0].kind.as_str(), merged[0].jobs), ("timeout", 6));
        assert_eq!((merged[0].example.id, merged[0].last_us), (3, 20));
        assert_eq!(
            (merged[1].kind.as_str(), merged[1].jobs),
            ("bad payload", 3)
        );
    }
}
