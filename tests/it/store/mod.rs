//! Every operation of `shardq::store` against a real PostgreSQL server: one
//! test per operation or small group, each asserting what the operation did
//! to the rows (not only that it returned `Ok`). Rows are set up through the
//! store's own operations; direct SQL only arranges states no operation
//! makes (a lease in the past, an old `finished_at`) or holds locks.
//!
//! One file per operation or module of the store; what they share is here.

mod claim;
mod complete;
mod error_kind;
mod insert;
mod lease;
mod one_job;
mod queues;
mod schema;
mod steps;
mod upkeep;

use crate::common;

use common::TestShards;
use serde_json::json;
use shardq::config::{Backoff, Config, DequeueMode};
use shardq::job::{ClaimedJob, Completion};
use shardq::shards::{Shard, ShardError, ShardSet};
use shardq::store::jobs::{self, Claim, ClaimParams, CompleteMany, NewRow, Written};
use shardq::store::JobStatus;
use shardq::{JobId, NewJob};
use std::time::Duration;

const OWNER: &str = "worker-a";
const LEASE: Duration = Duration::from_secs(60);

/// Long enough that a retry never becomes due during a test.
const RETRY: Backoff = Backoff {
    min: Duration::from_secs(60),
    max: Duration::from_secs(120),
};

/// One migrated shard on its own server.
async fn one_shard(extra: &str) -> (TestShards, Config, ShardSet) {
    let shards = TestShards::databases(1).await;
    let config = shards.config(extra);
    let set = shards.migrated(&config).await;
    (shards, config, set)
}

/// Inserts `jobs` with shard keys 1, 2, … and their own attempt limits (3
/// when unset).
async fn insert(shard: &Shard, jobs: &[NewJob]) -> Vec<JobId> {
    let rows: Vec<NewRow> = jobs
        .iter()
        .enumerate()
        .map(|(i, job)| NewRow {
            shard_key: i as i32 + 1,
            job,
            max_attempts: job.max_attempts.unwrap_or(3),
        })
        .collect();
    jobs::insert_many(shard, &rows).await.expect("insert")
}

fn job(queue: &str, n: i64) -> NewJob {
    NewJob::new(queue, "h", json!({ "n": n }))
}

fn params<'a>(queue: &'a str, limit: u32, owner: &'a str) -> ClaimParams<'a> {
    ClaimParams {
        queue,
        limit,
        owner,
        lease: LEASE,
        mode: DequeueMode::Ungated,
    }
}

/// Claims up to `limit` jobs of `queue` for `owner`; none when empty.
async fn claim(shard: &Shard, queue: &str, limit: u32, owner: &str) -> Vec<ClaimedJob> {
    match jobs::claim(shard, params(queue, limit, owner))
        .await
        .expect("claim")
    {
        Claim::Jobs(jobs) => jobs,
        Claim::Empty => Vec::new(),
        Claim::HeldBack(jobs) => jobs,
        Claim::Busy => panic!("an ungated claim is never busy"),
    }
}

async fn complete(shard: &Shard, owner: &str, done: &[Completion]) -> Written {
    jobs::complete_many(
        shard,
        CompleteMany {
            owner,
            retry: RETRY,
            done,
        },
    )
    .await
    .expect("complete")
}

async fn info(shard: &Shard, id: JobId) -> jobs::JobInfo {
    jobs::get(shard, id)
        .await
        .expect("get")
        .expect("job exists")
}

async fn status(shard: &Shard, id: JobId) -> JobStatus {
    info(shard, id).await.status
}

/// Runs `text` (setup SQL) on a user connection.
async fn exec(shard: &Shard, text: &str) {
    let client = shard.user_client().await.expect("user client");
    client.batch_execute(text).await.expect("setup sql");
}

/// One value `text` returns on a user connection.
async fn scalar<T>(shard: &Shard, text: &str) -> T
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    let client = shard.user_client().await.expect("user client");
    client.query_one(text, &[]).await.expect("sql").get(0)
}

/// Seconds from now until the job's `column` timestamp (negative: past).
async fn seconds_until(shard: &Shard, id: JobId, column: &str) -> f64 {
    scalar(
        shard,
        &format!(
            "SELECT extract(epoch FROM {column} - now())::float8 FROM workflow_status \
             WHERE shard_key = {} AND id = {}",
            id.shard_key, id.id
        ),
    )
    .await
}

fn where_id(id: JobId) -> String {
    format!("shard_key = {} AND id = {}", id.shard_key, id.id)
}

fn expect_err<T: std::fmt::Debug>(r: Result<T, ShardError>, what: &str) -> ShardError {
    match r {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => e,
    }
}
