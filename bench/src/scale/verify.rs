//! Every run checks its own result: each enqueued job completed exactly once.

use anyhow::{Context, Result};
use serde::Serialize;
use shardq::shards::ShardSet;
use std::time::Duration;

/// Per shard: rows of the queue by outcome.
const COUNTS_SQL: &str = "SELECT count(*), \
        count(*) FILTER (WHERE status = 'succeeded'), \
        count(*) FILTER (WHERE status = 'succeeded' AND attempts = 1), \
        count(*) FILTER (WHERE status IN ('waiting', 'scheduled', 'queued', 'running')) \
    FROM workflow_status WHERE queue = $1";

/// Attempts at the check (a restarted shard's pooled connections fail once).
const ATTEMPTS: usize = 5;

/// The check of one shard.
#[derive(Debug, Clone, Serialize)]
pub struct ShardCheck {
    /// Jobs the bench enqueued there.
    pub enqueued: u64,
    /// Rows of the queue.
    pub rows: i64,
    /// Rows that succeeded.
    pub succeeded: i64,
    /// Rows that succeeded on their first attempt.
    pub succeeded_first_attempt: i64,
    /// Rows still scheduled, queued or running.
    pub left: i64,
}

impl ShardCheck {
    /// Exactly once: every enqueued job is there, succeeded, on attempt 1, nothing left.
    pub fn ok(&self) -> bool {
        let n = self.enqueued as i64;
        self.rows == n && self.succeeded == n && self.succeeded_first_attempt == n && self.left == 0
    }
}

/// Counts the first `enqueued.len()` shards.
pub async fn check(shards: &ShardSet, queue: &str, enqueued: &[u64]) -> Result<Vec<ShardCheck>> {
    let mut out = Vec::with_capacity(enqueued.len());
    for (i, &n) in enqueued.iter().enumerate() {
        let shard = shards.get(i);
        let mut attempt = 0;
        let row = loop {
            attempt += 1;
            let result = async {
                let db = shard.client().await?;
                db.query_one(COUNTS_SQL, &[&queue])
                    .await
                    .map_err(|e| shard.query_error(e))
            }
            .await;
            match result {
                Ok(row) => break row,
                Err(_) if attempt < ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(500)).await
                }
                Err(e) => return Err(e).context("cannot check the run's jobs"),
            }
        };
        out.push(ShardCheck {
            enqueued: n,
            rows: row.get(0),
            succeeded: row.get(1),
            succeeded_first_attempt: row.get(2),
            left: row.get(3),
        });
    }
    Ok(out)
}
