//! The shards a part measures on: fresh local servers (one per shard),
//! migrated, with an observer's pools for filling, polling and reading the
//! servers' counters, apart from the pools of the worker under test.

use crate::procfs;
use anyhow::{bail, Context, Result};
use shardq::config::Config;
use shardq::shards::ShardSet;
use shardq::{Client, JobId, NewJob, Shardq};
use shardq_harness::{LocalCluster, ShardList};
use std::time::{Duration, Instant};

/// The queue of every workflow of the benchmark.
pub const QUEUE: &str = "workflows";

/// Marks the observer's own statements, so that the statement counts
/// leave them out (pg_stat_statements keeps a statement's comments).
pub const OBSERVER: &str = "/* shardq-bench observer */";

/// Workflows handed to one `enqueue_many` call.
const FILL_CHUNK: usize = 5_000;

/// How often a wait polls the shards: a poll counts every row (a few ms of
/// the database's CPU at 20,000 rows), so seldom enough to cost it about
/// 1%, often enough to time a run of seconds within 1%.
const POLL: Duration = Duration::from_millis(100);

/// Run after a fill, one statement each: fresh statistics, no dirty pages
/// left for the measured run to write.
const SETTLE_SQL: &[&str] = &["VACUUM ANALYZE workflow_status", "CHECKPOINT"];

/// The worker's settings: the defaults a user gets, on the benchmark's
/// queue; with `small_buffers`, the torture run's small buffer and batch
/// (what users with slow jobs set).
fn worker_settings(small_buffers: bool) -> String {
    let mut text = format!("\n[worker]\nqueues = [\"{QUEUE}\"]\n");
    if small_buffers {
        text.push_str("buffer_jobs = 200\n[dequeue]\nbatch_size = 50\n");
    }
    text
}

/// Counts of a shard's workflows, summed over the shards.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// Succeeded.
    pub succeeded: i64,
    /// Parked (`scheduled` and `parked`: asleep or waiting).
    pub parked: i64,
    /// Ended otherwise: dead or cancelled (none should).
    pub failed: i64,
}

/// `n` fresh local shards, each its own server.
pub struct BenchShards {
    // Declared first: the pools close before the servers stop.
    observer: ShardSet,
    client: Client,
    config: Config,
    postmasters: Vec<u32>,
    statements: bool,
    version: String,
    cluster: LocalCluster,
}

impl BenchShards {
    /// Starts `n` servers, migrates them, loads pg_stat_statements where
    /// the server has it preloaded.
    pub async fn start(n: usize) -> Result<BenchShards> {
        BenchShards::start_with(n, false).await
    }

    /// [`BenchShards::start`], the worker with small buffers or not
    /// ([`worker_settings`]).
    pub async fn start_with(n: usize, small_buffers: bool) -> Result<BenchShards> {
        let cluster = LocalCluster::start("shardq-workflows", n, None).await?;
        let settings = worker_settings(small_buffers);
        let text = ShardList::numbered((0..n).map(|i| cluster.url(i))).toml(&settings);
        let config = Config::from_toml(&text).context("the benchmark's config is invalid")?;
        let observer = ShardSet::connect(&config)?;
        shardq::migrate::migrate_all(&observer).await?;
        let postmasters = cluster
            .servers()
            .iter()
            .map(|s| procfs::postmaster_pid(&s.data_dir))
            .collect::<Result<Vec<_>>>()?;
        let mut statements = true;
        for shard in observer.all() {
            let db = shard.client().await?;
            // Absent when the server was built without it: the counts are then left out.
            statements &= db
                .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                .await
                .is_ok();
        }
        let version = observer
            .get(0)
            .client()
            .await?
            .query_one("SHOW server_version", &[])
            .await?
            .get(0);
        let client = Client::from_shards(observer.clone(), config.limits.clone());
        Ok(BenchShards {
            observer,
            client,
            config,
            postmasters,
            statements,
            version,
            cluster,
        })
    }

    /// Freezes shard `index`'s server for `hold` (every process of it
    /// stopped, then continued): connections stay open, nothing answers.
    pub async fn freeze(&self, index: usize, hold: Duration) -> Result<()> {
        self.cluster.freeze(index, hold).await?;
        Ok(())
    }

    /// How many shards.
    pub fn len(&self) -> usize {
        self.postmasters.len()
    }

    /// `SHOW server_version` of shard 0.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The postmasters' pids, whose process trees are the servers.
    pub fn postmasters(&self) -> &[u32] {
        &self.postmasters
    }

    /// Whether pg_stat_statements counts the statements.
    pub fn counts_statements(&self) -> bool {
        self.statements
    }

    /// The observer's pools.
    pub fn observer(&self) -> &ShardSet {
        &self.observer
    }

    /// A fresh `Shardq` for the worker under test (its own pools, closed
    /// when it is dropped, which also flushes its sessions' statistics).
    pub fn shardq(&self) -> Result<Shardq> {
        Ok(Shardq::connect(self.config.clone())?)
    }

    /// Empties the job tables of every shard.
    pub async fn reset(&self) -> Result<()> {
        for shard in self.observer.all() {
            shardq_harness::reset(shard).await?;
        }
        Ok(())
    }

    /// Enqueues `jobs` (in chunks), then settles the tables; their ids in order.
    pub async fn fill(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>> {
        let mut ids = Vec::with_capacity(jobs.len());
        let mut jobs = jobs.into_iter().peekable();
        while jobs.peek().is_some() {
            let chunk: Vec<NewJob> = jobs.by_ref().take(FILL_CHUNK).collect();
            ids.extend(self.client.enqueue_many(chunk).await?);
        }
        for shard in self.observer.all() {
            let db = shard.client().await?;
            for sql in SETTLE_SQL {
                db.batch_execute(sql)
                    .await
                    .with_context(|| format!("`{sql}` failed"))?;
            }
        }
        Ok(ids)
    }

    /// The workflows' counts over every shard.
    pub async fn counts(&self) -> Result<Counts> {
        let sql = format!(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'), \
                    count(*) FILTER (WHERE status = 'scheduled' AND parked), \
                    count(*) FILTER (WHERE status IN ('dead', 'cancelled')) \
             FROM workflow_status {OBSERVER}"
        );
        let mut counts = Counts::default();
        for shard in self.observer.all() {
            let row = shard.client().await?.query_one(sql.as_str(), &[]).await?;
            counts.succeeded += row.get::<_, i64>(0);
            counts.parked += row.get::<_, i64>(1);
            counts.failed += row.get::<_, i64>(2);
        }
        Ok(counts)
    }

    /// Up to `n` unfinished workflows per shard, as evidence: shard,
    /// handler, status, parked, attempts, seconds until `run_at`, error.
    async fn unfinished(&self, n: i64) -> Result<Vec<String>> {
        let mut found = Vec::new();
        for shard in self.observer.all() {
            for r in shard
                .client()
                .await?
                .query(
                    "SELECT handler, status, parked, attempts, \
                        extract(epoch FROM run_at - now())::float8, error \
                     FROM workflow_status WHERE status <> 'succeeded' LIMIT $1",
                    &[&n],
                )
                .await?
            {
                let (handler, status, parked): (String, String, bool) =
                    (r.get(0), r.get(1), r.get(2));
                let (attempts, due_in, error): (i32, Option<f64>, Option<String>) =
                    (r.get(3), r.get(4), r.get(5));
                found.push(format!(
                    "{} {handler} {status} parked={parked} attempts={attempts} due_in_s={due_in:?} error={error:?}",
                    shard.name
                ));
            }
        }
        Ok(found)
    }

    /// Polls until `done` says so; fails past `limit`, or when a workflow
    /// ended otherwise than succeeded. How long it took.
    pub async fn wait_until(
        &self,
        what: &str,
        limit: Duration,
        done: impl Fn(&Counts) -> bool,
    ) -> Result<Duration> {
        let started = Instant::now();
        loop {
            let counts = self.counts().await?;
            if counts.failed > 0 {
                bail!("{} workflows died or were cancelled while waiting for {what}: see the worker's log", counts.failed);
            }
            if done(&counts) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > limit {
                let stuck = self.unfinished(5).await.unwrap_or_default();
                bail!("timed out after {limit:?} waiting for {what} ({counts:?}); unfinished: {stuck:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
