//! The ready floors of a queue and priority (migration 27), made before
//! its first job is written: the trigger that numbers a ready job would
//! otherwise create them in the enqueuing transaction, and a second
//! transaction enqueueing into the same new queue and priority would wait
//! for that one to commit (the first's insert of the floor row holds it).
//! Made once per process, shard, queue and priority, in a statement of its
//! own, before a job is written in the caller's transaction
//! (`RoutedJob::insert`); shardq's own enqueues are one statement each and
//! the trigger makes the floors there, as for a job written by SQL.

use super::exec;
use super::sql;
use crate::job::NewJob;
use crate::shards::{Shard, ShardError};
use tokio_postgres::types::Type;

/// Makes sure the ready floors of the queues and priorities of `jobs`
/// (those without a group: grouped jobs have none) exist on `shard`.
///
/// # Errors
///
/// [`ShardError`] when the shard fails (nothing is remembered then).
///
/// # Cancel safety
///
/// Cancel safe: the statement writes only what is missing.
pub(crate) async fn ensure<'a>(
    shard: &Shard,
    jobs: impl IntoIterator<Item = &'a NewJob>,
) -> Result<(), ShardError> {
    let missing: Vec<(String, i32)> = {
        let made = shard.floors_made.lock().expect("floors made");
        let mut missing: Vec<(String, i32)> = jobs
            .into_iter()
            .filter(|j| j.group.is_none())
            .map(|j| (j.queue.clone(), j.priority))
            .filter(|pair| !made.contains(pair))
            .collect();
        missing.sort();
        missing.dedup();
        missing
    };
    if missing.is_empty() {
        return Ok(());
    }
    let queues: Vec<&str> = missing.iter().map(|(q, _)| q.as_str()).collect();
    let priorities: Vec<i32> = missing.iter().map(|(_, p)| *p).collect();
    exec::query(
        shard,
        sql::READY_FLOORS_ENSURE,
        &[(&queues, Type::TEXT_ARRAY), (&priorities, Type::INT4_ARRAY)],
    )
    .await?;
    shard
        .floors_made
        .lock()
        .expect("floors made")
        .extend(missing);
    Ok(())
}
