//! The benchmark's own PostgreSQL server: started fresh, migrated, described
//! in a temporary shards.toml for the worker subprocesses, refilled before
//! every run so each run starts from the same state.

use crate::procfs;
use anyhow::{Context, Result};
use shardq::config::Backoff;
use shardq::shards::{Shard, ShardSet};
use shardq::{Client, NewJob};
use shardq_local::EphemeralServer;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The queue every benchmark job goes to.
pub const QUEUE: &str = "bench";

/// Jobs handed to one `enqueue_many` call.
const FILL_CHUNK: usize = 20_000;

/// Run after a fill, one statement each (VACUUM refuses a multi-statement
/// string): fresh statistics and visibility map, and no dirty pages left from
/// the fill, so that no run pays for the previous one.
const SETTLE_SQL: &[&str] = &["VACUUM ANALYZE workflow_status", "CHECKPOINT"];

/// How long the connection tasks get to close before the server stops.
const CLOSE_GRACE: Duration = Duration::from_millis(100);

/// A running server with one migrated `shardq` database.
pub struct BenchServer {
    // Declared first so the config file goes before the server stops.
    config_file: ConfigFile,
    server: EphemeralServer,
    shards: ShardSet,
    client: Client,
    postmaster: u32,
    version: String,
    retry_backoff: Backoff,
}

impl BenchServer {
    /// Starts a server on a free port, migrates it, writes the shards.toml.
    pub async fn start() -> Result<BenchServer> {
        let shardq_harness::OneShard {
            server,
            toml,
            config,
            shards,
        } = shardq_harness::one_shard("bench-0", "").await?;
        let config_file = ConfigFile::write(&toml)?;
        let client = Client::from_shards(shards.clone(), config.limits.clone());
        let postmaster = procfs::postmaster_pid(&server.server().data_dir)?;
        let version = shards
            .get(0)
            .client()
            .await?
            .query_one("SHOW server_version", &[])
            .await
            .context("cannot read the server version")?
            .get(0);
        Ok(BenchServer {
            config_file,
            server,
            shards,
            client,
            postmaster,
            version,
            retry_backoff: config.worker.retry_backoff,
        })
    }

    /// The default retry backoff, which completions need (noop jobs never use it).
    pub fn retry_backoff(&self) -> Backoff {
        self.retry_backoff
    }

    /// Sets the job table's fillfactor (`--table-fillfactor`); every run
    /// starts from an emptied table, so each fills pages under it.
    pub async fn set_table_fillfactor(&self, fillfactor: u8) -> Result<()> {
        let db = self.shard().client().await?;
        db.batch_execute(&format!(
            "ALTER TABLE workflow_status SET (fillfactor = {fillfactor})"
        ))
        .await
        .context("cannot set the job table's fillfactor")?;
        Ok(())
    }

    /// Where the server's WAL is, in bytes since its start: the difference
    /// of two readings is the WAL a run wrote.
    pub async fn wal_position(&self) -> Result<i64> {
        let db = self.shard().client().await?;
        let row = db
            .query_one(
                "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint AS wal",
                &[],
            )
            .await?;
        Ok(row.get("wal"))
    }

    /// A client of the one shard.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The one shard.
    pub fn shard(&self) -> &Shard {
        self.shards.get(0)
    }

    /// The shards.toml that points at this server.
    pub fn config_path(&self) -> &Path {
        &self.config_file.path
    }

    /// `SHOW server_version`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Where the data lives (says whether it is in memory, e.g. /dev/shm).
    pub fn data_dir(&self) -> &Path {
        &self.server.server().data_dir
    }

    /// The postmaster's pid, whose process tree is the server.
    pub fn postmaster(&self) -> u32 {
        self.postmaster
    }

    /// Closes the connections, then stops the server: stopping it under open
    /// connections makes their pool log warnings.
    pub async fn close(self) {
        let BenchServer {
            config_file,
            server,
            shards,
            client,
            ..
        } = self;
        drop((client, shards));
        // Lets the connection tasks send their goodbyes before the server goes.
        tokio::time::sleep(CLOSE_GRACE).await;
        drop((server, config_file));
    }

    /// Opens `n` pooled connections at once so a timed run does not pay for
    /// connecting.
    pub async fn warm_up(&self, n: usize) -> Result<()> {
        let shard = self.shard();
        let clients = futures_util::future::try_join_all((0..n).map(|_| shard.client())).await?;
        for client in &clients {
            client.simple_query("SELECT 1").await?;
        }
        Ok(())
    }

    /// Empties the tables, enqueues `jobs` noop jobs, settles the table.
    /// Returns how long the enqueue alone took.
    pub async fn refill(&self, jobs: usize) -> Result<Duration> {
        self.refill_spread(jobs, Spread::Nothing).await
    }

    /// [`BenchServer::refill`] with the jobs spread round-robin over groups
    /// or ordering keys.
    pub async fn refill_spread(&self, jobs: usize, spread: Spread) -> Result<Duration> {
        let db = self.shard().client().await?;
        shardq_harness::reset(self.shard()).await?;
        let started = Instant::now();
        let mut done = 0;
        while done < jobs {
            let n = FILL_CHUNK.min(jobs - done);
            let chunk = (done..done + n)
                .map(|i| {
                    let job = NewJob::new(QUEUE, shardq::worker::NOOP, serde_json::json!({}));
                    match spread {
                        Spread::Nothing => job,
                        Spread::Groups(g) => job.group(format!("tenant-{}", i % g.max(1))),
                        Spread::Keys(k) => job.ordering_key(format!("key-{}", i % k.max(1))),
                    }
                })
                .collect();
            self.client.enqueue_many(chunk).await?;
            done += n;
        }
        let took = started.elapsed();
        for sql in SETTLE_SQL {
            db.batch_execute(sql)
                .await
                .with_context(|| format!("`{sql}` failed"))?;
        }
        Ok(took)
    }
}

/// What a backlog's jobs are spread over, round-robin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// No group, no key.
    Nothing,
    /// This many groups (claims take turns among them).
    Groups(usize),
    /// This many ordering keys (each key's jobs run in order).
    Keys(usize),
}

impl BenchServer {
    /// Empties the job tables and enqueues one `sleep` job of `keep_alive`:
    /// it keeps a worker with `--until-empty` running while jobs are
    /// offered at a rate (a queue empty between two enqueues would end it).
    pub async fn reset_for_offer(&self, keep_alive: Duration) -> Result<()> {
        shardq_harness::reset(self.shard()).await?;
        let sleep = NewJob::new(
            QUEUE,
            shardq::worker::SLEEP,
            serde_json::json!({ "ms": keep_alive.as_millis() as u64 }),
        );
        self.client.enqueue(sleep).await?;
        Ok(())
    }

    /// Enqueues `jobs` no-op jobs at `rate` per second, a batch every
    /// [`OFFER_TICK`], as a steady producer would.
    pub async fn offer(&self, jobs: usize, rate: u32) -> Result<()> {
        let per_tick = ((f64::from(rate) * OFFER_TICK.as_secs_f64()).round() as usize).max(1);
        let mut tick = tokio::time::interval(OFFER_TICK);
        let mut done = 0;
        while done < jobs {
            tick.tick().await;
            let n = per_tick.min(jobs - done);
            let batch = (0..n)
                .map(|_| NewJob::new(QUEUE, shardq::worker::NOOP, serde_json::json!({})))
                .collect();
            self.client.enqueue_many(batch).await?;
            done += n;
        }
        Ok(())
    }
}

/// How often an offered load enqueues its next batch.
pub const OFFER_TICK: Duration = Duration::from_millis(50);

/// A shards.toml in the temp folder, deleted on drop.
struct ConfigFile {
    path: PathBuf,
}

impl ConfigFile {
    fn write(text: &str) -> Result<ConfigFile> {
        let path = std::env::temp_dir().join(format!("shardq-bench-{}.toml", std::process::id()));
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(ConfigFile { path })
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
