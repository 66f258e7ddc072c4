//! Writing debounced jobs: each joins its key's pending run or starts one
//! (`NewJob::debounce`).

use super::super::exec;
use super::super::sql;
use super::insert::NewRow;
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use std::collections::HashMap;
use tokio_postgres::types::Type;

/// Writes debounced `rows` on `shard` in one statement
/// ([`sql::JOB_INSERT_DEBOUNCED`]): each joins the pending run of its
/// (queue, debounce key), or is a new pending run under its id in `ids`
/// (from [`super::reserve_ids`] on this shard). No two rows may share a
/// queue and key (the caller keeps the last). Returns, in input order, the
/// id of the run each row is in. `epoch`: as [`super::insert_many_as`].
///
/// Safe to call again after a lost reply: a row whose id exists is the
/// earlier try's and is left as it is; one that joined a run is applied
/// again (it counts as an enqueue at the second try's time: the run may
/// start that much later, or, when it started meanwhile, this job is the
/// next pending run).
///
/// # Errors
///
/// [`ShardError`] when the statement fails (SQ004: as
/// [`super::insert_many_as`]); nothing is written then.
///
/// # Cancel safety
///
/// Not cancel safe (the rows may be written), but safe to call again.
///
/// # Panics
///
/// When a row is not debounced, or `ids` has another length than `rows`.
pub async fn insert_debounced(
    shard: &Shard,
    rows: &[NewRow<'_>],
    ids: &[i64],
    epoch: Option<i32>,
) -> Result<Vec<JobId>, ShardError> {
    assert_eq!(rows.len(), ids.len(), "one id per row");
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let debounce = |r: &NewRow<'_>| r.job.debounce.clone().expect("a debounced row");
    let keys: Vec<i32> = rows.iter().map(|r| r.shard_key).collect();
    let queues: Vec<&str> = rows.iter().map(|r| r.job.queue.as_str()).collect();
    let handlers: Vec<&str> = rows.iter().map(|r| r.job.handler.as_str()).collect();
    let priorities: Vec<i32> = rows.iter().map(|r| r.job.priority).collect();
    let payloads: Vec<&serde_json::Value> = rows.iter().map(|r| &r.job.payload).collect();
    let periods: Vec<i64> = rows.iter().map(|r| millis(debounce(r).period)).collect();
    let waits: Vec<i64> = rows.iter().map(|r| millis(debounce(r).max_wait)).collect();
    let attempts: Vec<i32> = rows.iter().map(|r| r.max_attempts).collect();
    let debounce_keys: Vec<String> = rows.iter().map(|r| debounce(r).key).collect();
    let timeouts: Vec<Option<i64>> = rows.iter().map(|r| r.job.timeout_ms()).collect();
    let ids_param = ids.to_vec();
    let written = exec::query(
        shard,
        sql::JOB_INSERT_DEBOUNCED,
        &[
            (&ids_param, Type::INT8_ARRAY),
            (&keys, Type::INT4_ARRAY),
            (&queues, Type::TEXT_ARRAY),
            (&handlers, Type::TEXT_ARRAY),
            (&priorities, Type::INT4_ARRAY),
            (&payloads, Type::JSONB_ARRAY),
            (&periods, Type::INT8_ARRAY),
            (&waits, Type::INT8_ARRAY),
            (&epoch, Type::INT4),
            (&attempts, Type::INT4_ARRAY),
            (&debounce_keys, Type::TEXT_ARRAY),
            (&timeouts, Type::INT8_ARRAY),
        ],
    )
    .await?;
    let runs: HashMap<(String, String), i64> = written
        .iter()
        .map(|r| ((r.get("queue"), r.get("debounce_key")), r.get("id")))
        .collect();
    Ok(rows
        .iter()
        .zip(ids)
        .zip(debounce_keys)
        .map(|((row, &own), key)| JobId {
            shard_key: row.shard_key,
            // Not returned: skipped as written under its own id already.
            id: runs
                .get(&(row.job.queue.clone(), key))
                .copied()
                .unwrap_or(own),
        })
        .collect())
}

/// `d` in whole milliseconds (a validated debounce is at most a year).
fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
