//! What each interval reads from every shard: the worker's heartbeat
//! counters (completions, claims and their time), dead row versions, the
//! oldest transaction's age, and the pickup times of the sampled jobs; and
//! the snapshot that holds the horizon.

use super::offer::Offered;
use super::report::{Interval, ShardInterval};
use anyhow::{Context, Result};
use shardq::job::JobId;
use shardq::shards::{Shard, ShardSet};
use std::sync::Arc;
use std::time::Duration;

/// The worker's cumulative counters on one shard, summed over its rows.
const COUNTERS: &str = "SELECT coalesce(sum(claims), 0)::bigint AS claims, coalesce(sum(claim_us), 0)::bigint AS claim_us \
    FROM shardq_workers";

/// Jobs finished in the span ($1, $2] of the database's clock, and that
/// clock now less [`SETTLE`] (the next span's end): a completion's
/// `finished_at` is its transaction's start, so the span ends a few seconds
/// back, past the completions still committing.
const FINISHED: &str = "SELECT count(*) AS n FROM workflow_status \
    WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled') \
      AND finished_at > $1 AND finished_at <= $2";

/// How far back of the database's clock a span of completions ends.
const SETTLE: &str = "SELECT now() - interval '5 seconds' AS until";

/// Dead row versions of the job table (the statistics' estimate), and the
/// age of the oldest open transaction but this one's.
const HORIZON: &str = "SELECT \
    (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'workflow_status') AS dead, \
    (SELECT coalesce(extract(epoch FROM now() - min(xact_start)), 0)::float8 \
        FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND xact_start IS NOT NULL) AS oldest_s";

/// Pickup of the sampled jobs, ms: enqueue to claim, by the database's
/// clock; a job not claimed yet counts what it has waited so far.
const PICKUPS: &str = "SELECT extract(epoch FROM coalesce(w.started_at, clock_timestamp()) \
        - w.created_at)::float8 * 1000.0 AS ms, w.started_at IS NULL AS waiting \
    FROM unnest($1::int[], $2::bigint[]) AS t(shard_key, id) \
    JOIN workflow_status w ON w.shard_key = t.shard_key AND w.id = t.id";

#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    claims: i64,
    claim_us: i64,
}

/// Reads one interval after another.
pub struct Sampler {
    shards: ShardSet,
    offered: Arc<Offered>,
    last_counters: Vec<Counters>,
    last_offered: Vec<u64>,
    /// Each shard's last span end of completions, by its clock.
    last_finished: Vec<Option<chrono::DateTime<chrono::Utc>>>,
    last_at: Duration,
}

impl Sampler {
    pub fn new(shards: ShardSet, offered: Arc<Offered>) -> Sampler {
        let n = shards.len();
        Sampler {
            shards,
            offered,
            last_counters: vec![Counters::default(); n],
            last_offered: vec![0; n],
            last_finished: vec![None; n],
            last_at: Duration::ZERO,
        }
    }

    /// The interval from the last call to `at`.
    pub async fn interval(&mut self, at: Duration, phase: &'static str) -> Result<Interval> {
        let seconds = (at - self.last_at).as_secs_f64().max(1e-3);
        let offered = self.offered.per_shard();
        let sampled = self.offered.take_sampled();
        let map = self.shards.routing().get();
        let mut out = Vec::with_capacity(self.shards.len());
        for shard in self.shards.all() {
            let i = shard.index;
            let counters = counters(shard).await?;
            let (dead, oldest_s) = horizon(shard).await?;
            let mine: Vec<JobId> = sampled
                .iter()
                .filter(|id| map.shard_for(id.shard_key) == i)
                .copied()
                .collect();
            let (mut pickups, waiting) = pickups(shard, &mine).await?;
            pickups.sort_by(f64::total_cmp);
            let (finished, span_s) = finished(shard, &mut self.last_finished[i]).await?;
            let before = self.last_counters[i];
            let claims = counters.claims - before.claims;
            out.push(ShardInterval {
                offered_per_s: (offered[i] - self.last_offered[i]) as f64 / seconds,
                completed_per_s: finished as f64 / span_s.max(1e-3),
                pickup_p50_ms: quantile(&pickups, 0.5),
                pickup_p99_ms: quantile(&pickups, 0.99),
                sampled: pickups.len(),
                waiting,
                claim_ms: (claims > 0)
                    .then(|| (counters.claim_us - before.claim_us) as f64 / claims as f64 / 1e3),
                dead_versions: dead,
                oldest_xact_s: oldest_s,
            });
            self.last_counters[i] = counters;
        }
        self.last_offered = offered;
        self.last_at = at;
        Ok(Interval {
            at_s: at.as_secs_f64(),
            phase,
            shards: out,
        })
    }
}

async fn counters(shard: &Shard) -> Result<Counters> {
    let row = shard.client().await?.query_one(COUNTERS, &[]).await?;
    Ok(Counters {
        claims: row.get("claims"),
        claim_us: row.get("claim_us"),
    })
}

/// Jobs finished since `last` (by the shard's clock), and the span's
/// seconds; `last` moves to the new span's end. The first span starts at
/// the shard's first job.
async fn finished(
    shard: &Shard,
    last: &mut Option<chrono::DateTime<chrono::Utc>>,
) -> Result<(i64, f64)> {
    let db = shard.client().await?;
    let until: chrono::DateTime<chrono::Utc> = db.query_one(SETTLE, &[]).await?.get("until");
    let from = match *last {
        Some(from) => from,
        None => db
            .query_one(
                "SELECT coalesce(min(created_at), now()) AS t FROM workflow_status",
                &[],
            )
            .await?
            .get("t"),
    };
    let n: i64 = db.query_one(FINISHED, &[&from, &until]).await?.get("n");
    *last = Some(until);
    Ok((n, (until - from).num_milliseconds() as f64 / 1e3))
}

async fn horizon(shard: &Shard) -> Result<(i64, f64)> {
    let row = shard.client().await?.query_one(HORIZON, &[]).await?;
    Ok((
        row.get::<_, Option<i64>>("dead").unwrap_or(0),
        row.get("oldest_s"),
    ))
}

/// The sampled jobs' pickups (ms) and how many of them wait still.
async fn pickups(shard: &Shard, ids: &[JobId]) -> Result<(Vec<f64>, usize)> {
    if ids.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let keys: Vec<i32> = ids.iter().map(|j| j.shard_key).collect();
    let jobs: Vec<i64> = ids.iter().map(|j| j.id).collect();
    let rows = shard
        .client()
        .await?
        .query(PICKUPS, &[&keys, &jobs])
        .await?;
    let waiting = rows.iter().filter(|r| r.get::<_, bool>("waiting")).count();
    Ok((rows.iter().map(|r| r.get("ms")).collect(), waiting))
}

/// The `q` quantile of sorted `values` (nearest rank), when there are any.
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// A session holding a REPEATABLE READ snapshot open: the xmin horizon of
/// its server stays where it was taken until [`Snapshot::release`].
pub struct Snapshot {
    client: tokio_postgres::Client,
    connection: tokio::task::JoinHandle<()>,
}

impl Snapshot {
    /// Opens a session of its own on `url` and takes the snapshot.
    pub async fn hold(url: &str) -> Result<Snapshot> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .context("cannot open the snapshot's session")?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        client
            .batch_execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ; \
                 SELECT count(*) FROM shardq_migrations",
            )
            .await
            .context("cannot take the snapshot")?;
        Ok(Snapshot { client, connection })
    }

    /// Ends the transaction and the session.
    pub async fn release(self) {
        let _ = self.client.batch_execute("COMMIT").await;
        drop(self.client);
        let _ = self.connection.await;
    }
}
