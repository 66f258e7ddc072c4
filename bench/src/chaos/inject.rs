//! `--inject-violations`: a check of the checks. After the drain (workers
//! stopped) it breaks invariants on purpose, a known number of times each; the
//! run then succeeds only when every check reports exactly what was injected
//! and nothing else.

use super::load::{is_workflow, Load};
use super::report::{self, Summary};
use super::sql;
use super::worker::{QUEUE, WORKFLOW_HANDLER};
use anyhow::{bail, ensure, Result};
use shardq::Client;

/// The invariants broken on purpose, and by how much.
pub const EXPECTED: &[(&str, u64)] = &[
    // A deleted row and a row put back in the queue.
    (report::LOST, 2),
    // A copied row and a completion naming a later attempt.
    (report::COMPLETED_TWICE, 2),
    (report::FOREIGN_ROWS, 1),
    (report::STEP_AGAIN, 1),
    (report::STEP_TWICE, 1),
    (report::STEP_NO_EFFECT, 1),
    (report::MISSING_STEP, 1),
];

/// The step whose records and effects the workflow injections change.
const VICTIM_STEP: &str = "two";

/// Breaks the invariants of [`EXPECTED`]: noop jobs by payload number on
/// whichever shard holds them, workflows on shard 0 (a different succeeded
/// workflow for each injection).
///
/// # Errors
///
/// When a shard fails, or when there are too few finished jobs to break.
pub async fn inject(client: &Client, load: &Load) -> Result<()> {
    let noops: Vec<i64> = (0..load.acknowledged.len())
        .filter(|&n| load.acknowledged[n] && !is_workflow(n as u64))
        .map(|n| n as i64)
        .take(3)
        .collect();
    ensure!(noops.len() == 3, "too few noop jobs to inject violations");
    let by_number = [
        (sql::INJECT_DUPLICATE_ROW, noops[0]),
        (sql::INJECT_UNFINISHED, noops[1]),
        (sql::INJECT_MISSING, noops[2]),
    ];
    for (statement, n) in by_number {
        let mut changed = 0;
        for shard in client.shards().all() {
            let db = shard.client().await?;
            changed += db
                .execute(statement, &[&QUEUE, &n])
                .await
                .map_err(|e| shard.query_error(e))?;
        }
        ensure!(
            changed == 1,
            "injection on job n={n} changed {changed} rows, not 1"
        );
    }
    let shard = client.shards().get(0);
    let db = shard.client().await?;
    let one = |what: &str, changed: u64| {
        ensure!(
            changed == 1,
            "injection `{what}` changed {changed} rows, not 1 (too few jobs?)"
        );
        Ok(())
    };
    one(
        "foreign row",
        db.execute(sql::INJECT_FOREIGN_ROW, &[&QUEUE]).await?,
    )?;
    one(
        "stale completion",
        db.execute(
            sql::INJECT_STALE_COMPLETION,
            &[&QUEUE, &WORKFLOW_HANDLER, &0i64],
        )
        .await?,
    )?;
    let on_steps = [
        ("effect after record", sql::INJECT_EFFECT_AFTER_RECORD),
        ("repeated effect", sql::INJECT_REPEATED_EFFECT),
        ("lost effect", sql::INJECT_LOST_EFFECT),
        ("missing step", sql::INJECT_MISSING_STEP),
    ];
    for (victim, (what, statement)) in (1i64..).zip(on_steps) {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&QUEUE, &WORKFLOW_HANDLER, &victim, &VICTIM_STEP];
        one(what, db.execute(statement, &params).await?)?;
    }
    tracing::warn!("violations injected on purpose (--inject-violations)");
    Ok(())
}

/// Whether the checks found exactly the injected violations.
///
/// # Errors
///
/// Names every invariant whose value differs from what was injected.
pub fn detected(summary: &Summary) -> Result<()> {
    let mut wrong = Vec::new();
    for invariant in &summary.invariants {
        let injected = EXPECTED
            .iter()
            .find(|(name, _)| *name == invariant.name)
            .map(|&(_, count)| count);
        match injected {
            Some(count) if invariant.value != count => wrong.push(format!(
                "`{}` is {}, {count} were injected",
                invariant.name, invariant.value
            )),
            None if !invariant.pass => wrong.push(format!("`{}` failed", invariant.name)),
            _ => {}
        }
    }
    if !wrong.is_empty() {
        bail!("self-check failed: {}", wrong.join("; "));
    }
    println!(
        "self-check PASS: the {} injected kinds of violation were each detected exactly",
        EXPECTED.len()
    );
    Ok(())
}
