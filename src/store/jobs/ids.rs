//! Job ids in rows and as statement parameters: what the operations on
//! job rows share. A leaf below them.

use crate::job::JobId;
use tokio_postgres::Row;

/// The job id in columns `shard_key` and `id`.
pub(super) fn job_id(row: &Row) -> JobId {
    JobId {
        shard_key: row.get("shard_key"),
        id: row.get("id"),
    }
}

/// Shard keys and ids of `jobs`, as two arrays for `unnest`.
pub(super) fn id_arrays(jobs: impl Iterator<Item = JobId>) -> (Vec<i32>, Vec<i64>) {
    jobs.map(|j| (j.shard_key, j.id)).unzip()
}
