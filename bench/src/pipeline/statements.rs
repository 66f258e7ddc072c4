//! Where the database time of a pipeline run goes, statement by statement:
//! `pg_stat_statements` (preloaded by the local servers) with nested
//! statements tracked, so the parts of the claim function show apart. Run
//! as an extra drain after the measured ones, since tracking every nested
//! statement costs a few percent.

use anyhow::{Context, Result};
use serde::Serialize;
use shardq::shards::Shard;

/// Statements shown: the rest are summed into one line.
const TOP: usize = 20;
/// Characters of a statement's text shown.
const TEXT: usize = 90;

/// One statement's share of a run.
#[derive(Debug, Clone, Serialize)]
pub struct StatementCost {
    /// The statement, shortened, whitespace folded.
    pub text: String,
    /// Whether it runs inside another (a function's statement).
    pub nested: bool,
    /// Times it ran.
    pub calls: i64,
    /// Rows it returned or changed.
    pub rows: i64,
    /// Execution time per job, µs (wall time inside the executor).
    pub exec_us_per_job: f64,
    /// Planning time per job, µs (top-level statements only: the plans of a
    /// function's statements are counted in the function's execution).
    pub plan_us_per_job: f64,
    /// Buffers read (found in shared buffers) per job.
    pub hits_per_job: f64,
    /// Buffers dirtied per job.
    pub dirtied_per_job: f64,
    /// WAL bytes per job.
    pub wal_bytes_per_job: f64,
}

/// Tracks nested statements from now on and forgets what was counted.
///
/// # Errors
///
/// When the extension is missing or the server refuses.
pub async fn start(shard: &Shard) -> Result<()> {
    let db = shard.client().await?;
    // One statement each: ALTER SYSTEM refuses a multi-statement string.
    for statement in [
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
        "ALTER SYSTEM SET pg_stat_statements.track = 'all'",
        "ALTER SYSTEM SET pg_stat_statements.track_planning = on",
        "SELECT pg_reload_conf()",
        "SELECT pg_stat_statements_reset()",
    ] {
        db.batch_execute(statement)
            .await
            .with_context(|| format!("cannot start pg_stat_statements: {statement}"))?;
    }
    Ok(())
}

/// What was counted since [`start`], per job of a run of `jobs`, the
/// costliest first; tracking goes back to top-level statements.
///
/// # Errors
///
/// When the server refuses.
pub async fn finish(shard: &Shard, jobs: u64) -> Result<Vec<StatementCost>> {
    let db = shard.client().await?;
    let rows = db
        .query(
            "SELECT regexp_replace(query, '\\s+', ' ', 'g') AS text, NOT toplevel AS nested, \
                calls, rows, total_exec_time, total_plan_time, shared_blks_hit, shared_blks_dirtied, wal_bytes::float8 AS wal \
             FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND query NOT LIKE '%pg_stat_statements%' \
             ORDER BY total_exec_time DESC",
            &[],
        )
        .await
        .context("cannot read pg_stat_statements")?;
    for statement in [
        "ALTER SYSTEM RESET pg_stat_statements.track",
        "ALTER SYSTEM RESET pg_stat_statements.track_planning",
        "SELECT pg_reload_conf()",
    ] {
        db.batch_execute(statement).await?;
    }
    let per_job = |x: f64| x / jobs.max(1) as f64;
    let mut costs: Vec<StatementCost> = rows
        .iter()
        .map(|r| StatementCost {
            text: r.get::<_, String>("text").chars().take(TEXT).collect(),
            nested: r.get("nested"),
            calls: r.get("calls"),
            rows: r.get("rows"),
            exec_us_per_job: per_job(r.get::<_, f64>("total_exec_time") * 1000.0),
            plan_us_per_job: per_job(r.get::<_, f64>("total_plan_time") * 1000.0),
            hits_per_job: per_job(r.get::<_, i64>("shared_blks_hit") as f64),
            dirtied_per_job: per_job(r.get::<_, i64>("shared_blks_dirtied") as f64),
            wal_bytes_per_job: per_job(r.get("wal")),
        })
        .collect();
    if costs.len() > TOP {
        let rest = costs.split_off(TOP);
        costs.push(StatementCost {
            text: format!("({} other statements)", rest.len()),
            nested: false,
            calls: rest.iter().map(|c| c.calls).sum(),
            rows: rest.iter().map(|c| c.rows).sum(),
            exec_us_per_job: rest.iter().map(|c| c.exec_us_per_job).sum(),
            plan_us_per_job: rest.iter().map(|c| c.plan_us_per_job).sum(),
            hits_per_job: rest.iter().map(|c| c.hits_per_job).sum(),
            dirtied_per_job: rest.iter().map(|c| c.dirtied_per_job).sum(),
            wal_bytes_per_job: rest.iter().map(|c| c.wal_bytes_per_job).sum(),
        });
    }
    Ok(costs)
}

/// Prints the profile of `run` ("an extra pipeline run of 1000 jobs") as
/// a table.
pub fn print(costs: &[StatementCost], run: &str) {
    println!();
    println!(
        "statement profile: {run} with pg_stat_statements tracking \
         nested statements (the claim function's parts are marked `>`); execution time is wall \
         time in the executor, summed over backends"
    );
    println!(
        "  {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}  statement",
        "calls", "rows", "exec µs/j", "plan µs/j", "hits/j", "dirty/j", "WAL B/j"
    );
    for c in costs {
        println!(
            "  {:>9} {:>10} {:>9.2} {:>9.2} {:>9.1} {:>9.3} {:>9.1}  {}{}",
            c.calls,
            c.rows,
            c.exec_us_per_job,
            c.plan_us_per_job,
            c.hits_per_job,
            c.dirtied_per_job,
            c.wal_bytes_per_job,
            if c.nested { "> " } else { "" },
            c.text
        );
    }
}
