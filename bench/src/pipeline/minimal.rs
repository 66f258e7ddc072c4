//! The minimal ceiling: the least SQL a queue can do on the same server, so
//! "pipeline / ceiling" can be read against a floor no design goes below. A
//! bare table (id, payload, a claimed flag) with one partial index of ready
//! rows; a claim is `UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED LIMIT
//! 1000) RETURNING`, a completion is `DELETE … WHERE id = ANY($1)`. No
//! owner, lease, fence, attempts, keys or history: none of the guarantees.

use super::drained::{Drained, BATCH};
use anyhow::{Context, Result};
use shardq::shards::Shard;
use std::time::Instant;

/// Creates (once) and fills the bare table with `jobs` ready rows, settled.
pub async fn refill(shard: &Shard, jobs: usize) -> Result<std::time::Duration> {
    let db = shard.client().await?;
    db.batch_execute(
        "SET statement_timeout = 0; \
         CREATE TABLE IF NOT EXISTS bench_minimal ( \
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
             payload jsonb NOT NULL, \
             claimed boolean NOT NULL DEFAULT false); \
         CREATE INDEX IF NOT EXISTS bench_minimal_ready ON bench_minimal (id) WHERE NOT claimed; \
         TRUNCATE bench_minimal",
    )
    .await
    .context("cannot create the minimal queue table")?;
    let started = Instant::now();
    db.execute(
        "INSERT INTO bench_minimal (payload) SELECT '{}' FROM generate_series(1, $1::bigint)",
        &[&(jobs as i64)],
    )
    .await?;
    let took = started.elapsed();
    // One statement per call: VACUUM refuses a multi-statement query.
    for settle in [
        "VACUUM ANALYZE bench_minimal",
        "CHECKPOINT",
        "RESET statement_timeout",
    ] {
        db.batch_execute(settle).await?;
    }
    Ok(took)
}

/// Claims and deletes batches until the table is empty.
pub async fn drain(shard: Shard) -> Result<Drained> {
    let db = shard.client().await?;
    let mut done = Drained::default();
    loop {
        let sent = Instant::now();
        let rows = db
            .query(
                "UPDATE bench_minimal m SET claimed = true \
                 FROM (SELECT id FROM bench_minimal WHERE NOT claimed \
                       ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) c \
                 WHERE m.id = c.id RETURNING m.id, m.payload",
                &[&i64::from(BATCH)],
            )
            .await?;
        done.claims += 1;
        done.claim_time += sent.elapsed();
        if rows.is_empty() {
            return Ok(done);
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        let sent = Instant::now();
        let deleted = db
            .execute("DELETE FROM bench_minimal WHERE id = ANY($1)", &[&ids])
            .await?;
        done.completes += 1;
        done.complete_time += sent.elapsed();
        done.jobs += deleted;
    }
}
