//! `shardq-bench horizon --explain-slow-ms`: the plans of shard 0's slow
//! statements as the worker's own sessions ran them (auto_explain, nested
//! statements too), kept next to the results. A plan made by hand later may
//! differ: the sessions keep the plans they made with older statistics.

use anyhow::{Context, Result};
use shardq::shards::Shard;
use shardq_harness::LocalCluster;
use std::path::Path;

/// Makes every new session of `shard` log the plans of its statements
/// slower than `ms`, nested ones too, with buffers (auto_explain).
pub async fn start(shard: &Shard, ms: u64) -> Result<()> {
    let db = shard.client().await?;
    // One statement each: ALTER SYSTEM refuses a multi-statement string.
    // Loaded here first, so that its settings are known.
    for statement in [
        "LOAD 'auto_explain'".to_string(),
        "ALTER SYSTEM SET session_preload_libraries = 'auto_explain'".to_string(),
        format!("ALTER SYSTEM SET auto_explain.log_min_duration = {ms}"),
        "ALTER SYSTEM SET auto_explain.log_nested_statements = on".to_string(),
        "ALTER SYSTEM SET auto_explain.log_analyze = on".to_string(),
        "ALTER SYSTEM SET auto_explain.log_buffers = on".to_string(),
        "ALTER SYSTEM SET auto_explain.log_timing = off".to_string(),
        "SELECT pg_reload_conf()".to_string(),
    ] {
        db.batch_execute(&statement)
            .await
            .with_context(|| format!("cannot start auto_explain: {statement}"))?;
    }
    Ok(())
}

/// Copies shard 0's server log (the plans logged) next to `out`, named
/// for the scenario `label`.
pub fn keep(cluster: &LocalCluster, out: &Path, label: &str) -> Result<()> {
    let plans = out.with_extension(format!("{}.plans.log", label.replace(' ', "-")));
    let log = cluster.servers()[0].data_dir.join("server.log");
    std::fs::copy(&log, &plans).with_context(|| format!("cannot copy {}", log.display()))?;
    eprintln!("  slow statements' plans written to {}", plans.display());
    Ok(())
}
