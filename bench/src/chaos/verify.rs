//! After the faults: wait for the queue to drain, then read every row back and
//! check the invariants against what the enqueuer was told.

use super::load::Load;
use super::sql;
use super::torture::keyed;
use super::worker::{QUEUE, STEPS, WORKFLOW_HANDLER};
use anyhow::Result;
use serde::Serialize;
use shardq::shards::ShardError;
use shardq::Client;
use std::time::{Duration, Instant};

/// How often the drain is polled (each poll counts the queue on every shard).
const DRAIN_POLL: Duration = Duration::from_secs(1);

/// How often drain progress is logged.
const DRAIN_LOG_EVERY: Duration = Duration::from_secs(5);

/// The handlers whose output names the attempt that produced it.
const ATTEMPT_IN_OUTPUT: [&str; 2] = [WORKFLOW_HANDLER, keyed::HANDLER];

/// Offending jobs quoted per failed check, as evidence.
const EXAMPLES: usize = 5;

/// Waits until no job of `queues` is waiting, scheduled, queued or running
/// on any shard. Returns when that was seen, or `None` at `deadline`.
pub async fn drain(client: &Client, queues: &[&str], deadline: Instant) -> Option<Instant> {
    let mut last_log = Instant::now();
    loop {
        match progress(client, queues).await {
            Ok((0, _, _)) => return Some(Instant::now()),
            Ok((unfinished, succeeded, total)) if last_log.elapsed() >= DRAIN_LOG_EVERY => {
                last_log = Instant::now();
                tracing::info!(unfinished, succeeded, total, "draining");
            }
            Ok(_) => {}
            Err(err) => tracing::debug!(error = %shardq::error_chain(&err), "drain poll failed"),
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

/// Unfinished, succeeded and all jobs of `queues`, over every shard.
async fn progress(client: &Client, queues: &[&str]) -> Result<(i64, i64, i64), ShardError> {
    let mut sums = (0, 0, 0);
    for shard in client.shards().all() {
        let db = shard.client().await?;
        let row = db
            .query_one(sql::QUEUE_PROGRESS, &[&queues])
            .await
            .map_err(|e| shard.query_error(e))?;
        sums.0 += row.get::<_, i64>(0);
        sums.1 += row.get::<_, i64>(1);
        sums.2 += row.get::<_, i64>(2);
    }
    Ok(sums)
}

/// What the rows say. Every count is over acknowledged jobs unless its name
/// says otherwise.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Checks {
    /// Acknowledged jobs that succeeded.
    pub succeeded: u64,
    /// Acknowledged jobs that are dead.
    pub dead: u64,
    /// Acknowledged jobs that ended failed or cancelled (nothing cancels here).
    pub other_final: u64,
    /// Acknowledged jobs with no row.
    pub missing: u64,
    /// Rows (acknowledged or not) still scheduled, queued or running.
    pub unfinished: u64,
    /// Payload numbers with more than one row.
    pub duplicate_rows: u64,
    /// Succeeded workflows whose output was written by another attempt than the last.
    pub stale_completions: u64,
    /// Rows of unacknowledged jobs (their chunk failed, but the write landed).
    pub unacknowledged_written: u64,
    /// Rows whose payload number was never sent.
    pub foreign_rows: u64,
    /// All succeeded rows, acknowledged or not (for the throughput).
    pub all_succeeded: u64,
    /// Rows that were claimed more than once (a kill, a lost lease or a failed attempt).
    pub claimed_again: u64,
    /// The most attempts any row took; many on a noop job means its leases kept expiring.
    pub most_attempts: i32,
    /// Recorded workflow steps.
    pub recorded_steps: i64,
    /// Recorded steps with no side effect from the attempt that recorded them.
    pub recorded_without_effect: i64,
    /// Side effects of a step from an attempt after the one that recorded it.
    pub effects_after_record: i64,
    /// Recorded steps that also ran in an earlier attempt whose record never landed.
    pub rerun_steps: i64,
    /// The side effects of those earlier runs.
    pub rerun_effects: i64,
    /// Side effects of steps that were never recorded (their workflow died or the record failed).
    pub unrecorded_effects: i64,
    /// (job, step, attempt) triples with more than one side effect.
    pub repeated_within_attempt: i64,
    /// Succeeded workflows without all their steps recorded.
    pub succeeded_missing_steps: i64,
    /// Offending jobs, as evidence.
    pub examples: Vec<String>,
    /// Errors of dead jobs (the first few).
    pub dead_errors: Vec<String>,
}

impl Checks {
    /// Acknowledged jobs with no row, or any job not finished after the drain.
    pub fn lost(&self) -> u64 {
        self.missing + self.unfinished
    }

    /// Jobs whose completion shows twice: two rows, or a completion by an older attempt.
    pub fn completed_twice(&self) -> u64 {
        self.duplicate_rows + self.stale_completions
    }

    fn example(&mut self, what: String) {
        if self.examples.len() < EXAMPLES * 4 {
            self.examples.push(what);
        }
    }
}

/// One row of [`sql::JOB_ROWS`].
struct JobRow {
    shard_key: i32,
    id: i64,
    n: Option<i64>,
    handler: String,
    status: String,
    attempts: i32,
    output_attempt: Option<i32>,
    error: Option<String>,
}

impl JobRow {
    fn describe(&self, shard: &str) -> String {
        format!(
            "{shard} job {}-{} (n={:?}, {}): status {}, attempts {}, output attempt {:?}, error {:?}",
            self.shard_key,
            self.id,
            self.n,
            self.handler,
            self.status,
            self.attempts,
            self.output_attempt,
            self.error
        )
    }
}

/// Reads every row of `queues` and every step record and side effect, and
/// counts what breaks an invariant.
///
/// # Errors
///
/// When a shard cannot be read.
pub async fn check(client: &Client, queues: &[&str], load: &Load) -> Result<Checks> {
    let mut checks = Checks::default();
    let mut rows_per_n = vec![0u32; load.acknowledged.len()];
    for shard in client.shards().all() {
        let db = shard.client().await?;
        let mut rows = Vec::new();
        for queue in queues {
            rows.extend(
                db.query(sql::JOB_ROWS, &[queue])
                    .await
                    .map_err(|e| shard.query_error(e))?,
            );
        }
        for row in rows {
            let job = JobRow {
                shard_key: row.get(0),
                id: row.get(1),
                n: row.get(2),
                handler: row.get(3),
                status: row.get(4),
                attempts: row.get(5),
                output_attempt: row.get(6),
                error: row.get(7),
            };
            check_row(&mut checks, &mut rows_per_n, load, &job, &shard.name);
        }
        let steps = db
            .query_one(
                sql::STEP_CHECKS,
                &[&QUEUE, &WORKFLOW_HANDLER, &(STEPS.len() as i64)],
            )
            .await
            .map_err(|e| shard.query_error(e))?;
        checks.recorded_steps += steps.get::<_, i64>(0);
        checks.recorded_without_effect += steps.get::<_, i64>(1);
        checks.effects_after_record += steps.get::<_, i64>(2);
        checks.rerun_steps += steps.get::<_, i64>(3);
        checks.rerun_effects += steps.get::<_, i64>(4);
        checks.unrecorded_effects += steps.get::<_, i64>(5);
        checks.repeated_within_attempt += steps.get::<_, i64>(6);
        checks.succeeded_missing_steps += steps.get::<_, i64>(7);
        if steps.get::<_, i64>(2) > 0 || steps.get::<_, i64>(6) > 0 {
            for example in db
                .query(
                    sql::STEP_VIOLATIONS,
                    &[&QUEUE, &WORKFLOW_HANDLER, &(EXAMPLES as i64)],
                )
                .await
                .map_err(|e| shard.query_error(e))?
            {
                checks.example(format!(
                    "{} job {}-{} step {}: effect of attempt {} (x{}), step recorded by attempt {:?}",
                    shard.name,
                    example.get::<_, i32>(0),
                    example.get::<_, i64>(1),
                    example.get::<_, String>(2),
                    example.get::<_, i32>(3),
                    example.get::<_, i64>(4),
                    example.get::<_, Option<i32>>(5),
                ));
            }
        }
    }
    for (n, &count) in rows_per_n.iter().enumerate() {
        if count == 0 && load.acknowledged[n] {
            checks.missing += 1;
            checks.example(format!("n={n}: acknowledged, but no row on any shard"));
        }
    }
    Ok(checks)
}

fn check_row(checks: &mut Checks, rows_per_n: &mut [u32], load: &Load, job: &JobRow, shard: &str) {
    let known = job
        .n
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n < rows_per_n.len());
    let Some(n) = known else {
        checks.foreign_rows += 1;
        checks.example(format!("row nobody enqueued: {}", job.describe(shard)));
        return;
    };
    rows_per_n[n] += 1;
    if job.attempts > 1 {
        checks.claimed_again += 1;
    }
    checks.most_attempts = checks.most_attempts.max(job.attempts);
    if rows_per_n[n] == 2 {
        checks.duplicate_rows += 1;
        checks.example(format!("second row for n={n}: {}", job.describe(shard)));
    }
    let status = job.status.as_str();
    if status == "succeeded" {
        checks.all_succeeded += 1;
    }
    if matches!(status, "scheduled" | "queued" | "running") {
        checks.unfinished += 1;
        checks.example(format!(
            "unfinished after the drain: {}",
            job.describe(shard)
        ));
    }
    if ATTEMPT_IN_OUTPUT.contains(&job.handler.as_str())
        && status == "succeeded"
        && job.output_attempt != Some(job.attempts)
    {
        checks.stale_completions += 1;
        checks.example(format!(
            "completion from another attempt: {}",
            job.describe(shard)
        ));
    }
    if !load.acknowledged[n] {
        checks.unacknowledged_written += 1;
        return;
    }
    match status {
        "succeeded" => checks.succeeded += 1,
        "dead" => {
            checks.dead += 1;
            if checks.dead_errors.len() < EXAMPLES {
                checks.dead_errors.push(job.describe(shard));
            }
        }
        "failed" | "cancelled" => checks.other_final += 1,
        _ => {}
    }
}
