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
    /// Runs whose order is checked (succeeded attempts, and failures by
    /// design that were written).
    pub checked_runs: i64,
    /// Runs that started after a run of a later job of their key (not the
    /// re-run of a job whose outcome its dead worker lost, behind the runs
    /// that worker made after it in the same claim).
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
/// `lost_leases` (stopped past their lease) are not checked, nor failures by
/// design that were never written (their worker died first), and the re-run
/// of a job whose outcome a dead worker lost is not out of order behind the
/// runs that worker made after it in the same claim (`sql::ORDER_CHECKS`).
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
                &[
                    &unacknowledged,
                    &HANDLER,
                    &lost_leases,
                    &sql::BY_DESIGN_MARK,
                ],
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
                &[
                    &unacknowledged,
                    &EXAMPLES,
                    &lost_leases,
                    &sql::BY_DESIGN_MARK,
                ],
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

#[cfg(test)]
mod tests {
    use super::super::super::sql;
    use super::HANDLER;
    use shardq::config::Config;
    use shardq::shards::ShardSet;
    use shardq_local::EphemeralServer;

    /// A succeeded keyed job of queue q, key `key`, after `attempts` attempts.
    const JOB_INSERT: &str = "INSERT INTO workflow_status \
        (shard_key, queue, handler, status, payload, attempts, ordering_key, finished_at) \
        VALUES (0, 'q', $1, 'succeeded', jsonb_build_object('n', $2::bigint), $3, $4, now()) \
        RETURNING id";

    /// A run of attempt $2 of job $1 (key $3) by process $5 in claim $6
    /// (seconds), started at second $7 and finished 0.1 s later; $4: it
    /// failed by design; $8 the job's error when it started.
    const RUN_INSERT: &str = "INSERT INTO torture_runs (queue, ordering_key, shard_key, job_id, \
        attempt, by_design, pid, claimed_at, started_at, finished_at, error_at_start) \
        VALUES ('q', $3, 0, $1, $2, $4, $5, to_timestamp($6::float8), to_timestamp($7::float8), \
            to_timestamp($7::float8 + 0.1), $8)";

    /// A run: job, attempt, key, by design, pid, claim (s), start (s), the
    /// job's error at its start.
    type Run<'a> = (i64, i32, &'a str, bool, i32, f64, f64, Option<&'a str>);

    /// Four keys, two jobs each (the earlier, `a`, then `b`):
    /// - "lost": one worker ran a, then b (failing by design), and died
    ///   before writing either; both ran again, in order. At-least-once, not
    ///   out of order (the long torture run flagged this shape twice).
    /// - "lost success": one worker ran a and b in one claim; b's success
    ///   was written, a's was lost with the worker; a ran again after b.
    ///   At-least-once: a's first run came before b's.
    /// - "overtaken": a failed by design and the failure was written; b ran
    ///   before a's retry. Out of order.
    /// - "recovered": a's worker died; a's lease expired; b, claimed by
    ///   another worker, ran before a's re-run. Out of order.
    #[tokio::test]
    async fn a_dead_workers_unwritten_failure_is_no_order_break_but_an_overtaken_retry_is() {
        let server = EphemeralServer::start().await.expect("start postgres");
        let config = Config::from_toml(&format!(
            "[[shards]]\nname = \"s0\"\nurl = \"{}\"\n",
            server.url()
        ))
        .unwrap();
        let shards = ShardSet::connect(&config).unwrap();
        shardq::migrate::migrate_all(&shards).await.unwrap();
        let db = shards.all()[0].client().await.unwrap();
        db.batch_execute(sql::RUNS_CREATE).await.unwrap();
        let failed = format!("job n=1 {}", sql::BY_DESIGN_MARK);
        let mut n = 0i64;
        let mut job = |key: &'static str, attempts: i32| {
            n += 1;
            let db = &db;
            async move {
                db.query_one(JOB_INSERT, &[&HANDLER, &n, &attempts, &key])
                    .await
                    .unwrap()
                    .get::<_, i64>(0)
            }
        };
        let (lost_a, lost_b) = (job("lost", 2).await, job("lost", 2).await);
        let (kept_a, kept_b) = (job("lost success", 2).await, job("lost success", 1).await);
        let (over_a, over_b) = (job("overtaken", 2).await, job("overtaken", 1).await);
        let (rec_a, rec_b) = (job("recovered", 2).await, job("recovered", 1).await);
        let runs: [Run; 13] = [
            (lost_a, 1, "lost", false, 10, 1.0, 1.0, None),
            (lost_b, 1, "lost", true, 10, 1.0, 2.0, None),
            (lost_a, 2, "lost", false, 20, 9.0, 9.0, None),
            (lost_b, 2, "lost", false, 20, 9.0, 10.0, None),
            (kept_a, 1, "lost success", false, 10, 1.0, 1.0, None),
            (kept_b, 1, "lost success", false, 10, 1.0, 2.0, None),
            (kept_a, 2, "lost success", false, 20, 9.0, 9.0, None),
            (over_a, 1, "overtaken", true, 10, 1.0, 1.0, None),
            (over_b, 1, "overtaken", false, 11, 3.0, 3.0, None),
            (over_a, 2, "overtaken", false, 12, 4.0, 4.0, Some(&failed)),
            (rec_a, 1, "recovered", false, 10, 1.0, 1.0, None),
            (rec_b, 1, "recovered", false, 11, 9.0, 9.0, None),
            (rec_a, 2, "recovered", false, 12, 10.0, 10.0, None),
        ];
        for (id, attempt, key, by_design, pid, claim, start, error) in runs {
            db.execute(
                RUN_INSERT,
                &[
                    &id, &attempt, &key, &by_design, &pid, &claim, &start, &error,
                ],
            )
            .await
            .unwrap();
        }
        let none: Vec<i64> = Vec::new();
        let no_pids: Vec<i32> = Vec::new();
        let row = db
            .query_one(
                sql::ORDER_CHECKS,
                &[&none, &HANDLER, &no_pids, &sql::BY_DESIGN_MARK],
            )
            .await
            .unwrap();
        let examples: Vec<(String, i64, i32, Option<i64>)> = db
            .query(
                sql::ORDER_VIOLATIONS,
                &[&none, &10i64, &no_pids, &sql::BY_DESIGN_MARK],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect();
        assert_eq!(
            examples,
            vec![
                ("overtaken".to_string(), over_a, 2, Some(over_b)),
                ("recovered".to_string(), rec_a, 2, Some(rec_b)),
            ],
            "the overtaken retry and the overtaken re-run, not the dead worker's runs"
        );
        assert_eq!(row.get::<_, i64>(1), 2, "runs out of order");
        assert_eq!(row.get::<_, i64>(2), 0, "overlaps");
        // Checked: the eight succeeded attempts and the one written failure.
        assert_eq!(row.get::<_, i64>(0), 9, "checked runs");
    }
}
