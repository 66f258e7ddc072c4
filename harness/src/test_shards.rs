//! For the integration tests: real PostgreSQL servers started per test,
//! shards as fresh databases on them, and a shardq config pointing at those
//! shards.

pub use crate::shard_list::ShardList;
use shardq::config::Config;
use shardq::shards::ShardSet;
use shardq_local::{create_database, EphemeralServer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

static DB_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Shards for one test, and the servers that hold them (stopped on drop).
pub struct TestShards {
    pub servers: Vec<EphemeralServer>,
    /// One URL per shard.
    pub urls: Vec<String>,
}

impl TestShards {
    /// `n` shards as `n` fresh databases on one new server.
    pub async fn databases(n: usize) -> TestShards {
        let server = EphemeralServer::start().await.expect("start postgres");
        let mut urls = Vec::new();
        for _ in 0..n {
            let name = format!("shard_{}", DB_COUNTER.fetch_add(1, Ordering::Relaxed));
            create_database(&server.admin_url(), &name)
                .await
                .expect("create database");
            let admin = server.admin_url();
            let base = admin.rsplit_once('/').expect("url has a database").0;
            urls.push(format!("{base}/{name}"));
        }
        TestShards {
            servers: vec![server],
            urls,
        }
    }

    /// `n` shards, each its own server (for tests that stop one).
    pub async fn servers(n: usize) -> TestShards {
        let servers = futures_util::future::try_join_all((0..n).map(|_| EphemeralServer::start()))
            .await
            .expect("start postgres");
        let urls = servers.iter().map(|s| s.url()).collect();
        TestShards { servers, urls }
    }

    /// The shard list as TOML, followed by `extra` (more sections).
    pub fn toml(&self, extra: &str) -> String {
        ShardList::numbered(&self.urls).pool_size(12).toml(extra)
    }

    /// A validated config over these shards with `extra` sections.
    pub fn config(&self, extra: &str) -> Config {
        Config::from_toml(&self.toml(extra)).expect("valid test config")
    }

    /// Pools over these shards, migrated.
    pub async fn migrated(&self, config: &Config) -> ShardSet {
        let shards = ShardSet::connect(config).expect("pools");
        shardq::migrate::migrate_all(&shards)
            .await
            .expect("migrate");
        shards
    }
}

/// Counts jobs with `status` on every shard.
pub async fn count_status(shards: &ShardSet, status: &str) -> i64 {
    let mut total = 0;
    for shard in shards.all() {
        total += count_on(shard, status).await.expect("count");
    }
    total
}

/// Counts jobs with `status` on one shard.
pub async fn count_on(
    shard: &shardq::shards::Shard,
    status: &str,
) -> Result<i64, shardq::shards::ShardError> {
    let client = shard.client().await?;
    let row = client
        .query_one(
            "SELECT count(*) FROM workflow_status WHERE status = $1",
            &[&status],
        )
        .await
        .map_err(|e| shard.query_error(e))?;
    Ok(row.get(0))
}

/// Polls `check` every 50 ms until it returns true: how long that took.
/// Panics naming `what` once `limit` has passed.
pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// Waits (10 s at most) until a session of `shard`'s database waits for a
/// lock: the point where a race test's second transaction is blocked by
/// the first.
pub async fn until_lock_wait(shard: &shardq::shards::Shard, what: &str) {
    let shard = shard.clone();
    wait_until(Duration::from_secs(10), what, || {
        let shard = shard.clone();
        async move {
            let n: i64 = shard
                .client()
                .await
                .unwrap()
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE wait_event_type = 'Lock' AND datname = current_database()",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            n > 0
        }
    })
    .await;
}

/// Microseconds since the Unix epoch: when a test's handler call started or
/// finished, comparable across processes.
pub fn micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_micros() as i64
}

/// A session of its own on `url` (as the user the URL names), its
/// connection driven by a task.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect a session");
    tokio::spawn(conn);
    client
}

/// A session on `url` holding a REPEATABLE READ snapshot that has read
/// `workflow_status`: the shard's xmin horizon stays where it is, and
/// vacuum removes no version that snapshot might see, until the session
/// commits or is dropped (a report or `pg_dump` left running).
pub async fn hold_snapshot(url: &str) -> tokio_postgres::Client {
    let holder = connect(url).await;
    holder
        .batch_execute(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM workflow_status",
        )
        .await
        .expect("take the snapshot");
    holder
}

/// What one of PostgreSQL's per-transaction statistics, `stat`
/// (`pg_stat_get_xact_<stat>`: `tuples_returned` for the index entries a
/// scan met, `blocks_fetched` for the blocks read), says of `relations`
/// together, for this transaction so far. The counts are this backend's,
/// not yet reported, so read them before and after a statement in one
/// transaction and take the difference.
pub async fn xact_stat(
    tx: &tokio_postgres::Transaction<'_>,
    stat: &str,
    relations: &[&str],
) -> i64 {
    assert!(
        stat.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
        "a statistic's name: {stat}"
    );
    let sql = format!(
        "SELECT coalesce(sum(pg_stat_get_xact_{stat}(r::regclass)), 0)::int8 \
         FROM unnest($1::text[]) r"
    );
    tx.query_one(&sql, &[&relations]).await.unwrap().get(0)
}
