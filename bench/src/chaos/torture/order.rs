//! After the drain: per (queue, key) order of the keyed runs, read from
//! `torture_runs` on every shard. Jobs of one key must start in id order and
//! never overlap, retries included: a job that failed by design runs again
//! before the later jobs of its key.

use super::super::load::Load;
use super::super::sql;
use super::keyed::HANDLER;
use anyhow::Result;
use serde::Serialize;
use shardq::Client;

/// Offending runs quoted, as evidence.
const EXAMPLES: i64 = 5;

/// What the runs say.
#[derive(Debug, Default, Clone, Serialize)]
pub struct OrderChecks {
    /// Runs whose order is checked (succeeded attempts and failures by design).
    pub checked_runs: i64,
    /// Runs that started after a run of a later job of their key.
    pub out_of_order: i64,
    /// Runs that started before the previous run of their key finished.
    pub overlaps: i64,
    /// (job, attempt) pairs that started more than once.
    pub attempt_started_twice: i64,
    /// Succeeded keyed jobs without a finished run of their last attempt.
    pub succeeded_without_run: i64,
    /// Distinct key strings of keyed jobs (each is a key in each queue it is used in).
    pub distinct_keys: i64,
    /// Keyed jobs that failed by design and ran again.
    pub retried_by_design: i64,
    /// Offending runs.
    pub examples: Vec<String>,
}

/// Reads the order checks of every shard; the runs of the worker processes
/// `lost_leases` (stopped past their lease) are not checked.
///
/// # Errors
///
/// When a shard cannot be read.
pub async fn check(client: &Client, load: &Load, lost_leases: &[u32]) -> Result<OrderChecks> {
    let lost_leases: Vec<i32> = lost_leases.iter().map(|&pid| pid as i32).collect();
    let unacknowledged: Vec<i64> = (0..load.acknowledged.len())
        .filter(|&n| !load.acknowledged[n])
        .map(|n| n as i64)
        .collect();
    let mut checks = OrderChecks::default();
    for shard in client.shards().all() {
        let db = shard.client().await?;
        let row = db
            .query_one(
                sql::ORDER_CHECKS,
                &[&unacknowledged, &HANDLER, &lost_leases],
            )
            .await
            .map_err(|e| shard.query_error(e))?;
        checks.checked_runs += row.get::<_, i64>(0);
        checks.out_of_order += row.get::<_, i64>(1);
        checks.overlaps += row.get::<_, i64>(2);
        checks.attempt_started_twice += row.get::<_, i64>(3);
        checks.succeeded_without_run += row.get::<_, i64>(4);
        checks.distinct_keys += row.get::<_, i64>(5);
        checks.retried_by_design += row.get::<_, i64>(6);
        if row.get::<_, i64>(1) + row.get::<_, i64>(2) == 0 {
            continue;
        }
        for bad in db
            .query(
                sql::ORDER_VIOLATIONS,
                &[&unacknowledged, &EXAMPLES, &lost_leases],
            )
            .await
            .map_err(|e| shard.query_error(e))?
        {
            checks.examples.push(format!(
                "{} {}/{}: job {} attempt {} started after job {:?} attempt {:?}{}",
                shard.name,
                bad.get::<_, String>(0),
                bad.get::<_, String>(1),
                bad.get::<_, i64>(2),
                bad.get::<_, i32>(3),
                bad.get::<_, Option<i64>>(4),
                bad.get::<_, Option<i32>>(5),
                if bad.get::<_, Option<bool>>(6) == Some(true) {
                    ", before that run finished"
                } else {
                    ""
                },
            ));
        }
    }
    Ok(checks)
}
