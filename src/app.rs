//! One entry point for an embedder: from a [`Config`] to a migrated shard
//! set, a client and workers, without touching pools or modules.

use crate::client::Client;
use crate::config::Config;
use crate::migrate::{self, MigrateError};
use crate::shards::{ShardError, ShardSet};
use crate::worker::{HandlerRegistry, Worker};

/// shardq over the shards of one configuration: pools to every shard (made
/// lazily: no connection is opened until first used), and from them clients
/// and workers. Cheap to clone.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use shardq::{Config, HandlerRegistry, NewJob, Shardq};
/// let shardq = Shardq::connect(Config::load(None)?)?;
/// shardq.migrate().await?;
/// shardq.client().enqueue(NewJob::new("emails", "send", serde_json::json!({}))).await?;
/// let mut handlers = HandlerRegistry::new();
/// handlers.register("send", |_ctx| async { Ok(serde_json::json!("sent")) });
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// shardq.worker(handlers).run(shutdown).await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Shardq {
    config: Config,
    shards: ShardSet,
}

impl Shardq {
    /// Pools over every shard of `config` (nothing is connected yet).
    ///
    /// # Errors
    ///
    /// [`ShardError`] when a shard's pool or TLS setup cannot be built.
    pub fn connect(config: Config) -> Result<Shardq, ShardError> {
        let shards = ShardSet::connect(&config)?;
        Ok(Shardq { config, shards })
    }

    /// Applies missing migrations to every shard (see [`migrate::migrate_all`]).
    ///
    /// # Errors
    ///
    /// [`MigrateError`]: a shard failed, or records another place in the
    /// shard map than the configuration gives it.
    ///
    /// # Cancel safety
    ///
    /// Each migration is applied whole or not at all (a no-transaction one
    /// statement by statement, each safe to run again), so a dropped future
    /// leaves a schema the next call completes.
    pub async fn migrate(&self) -> Result<(), MigrateError> {
        migrate::migrate_all(&self.shards).await.map(|_| ())
    }

    /// [`Shardq::migrate`], waiting up to `wait` for shards whose server is
    /// not accepting connections yet (see [`migrate::migrate_all_within`]).
    ///
    /// # Errors
    ///
    /// [`MigrateError::NotReady`] when a shard still refuses connections
    /// after `wait`; otherwise as [`Shardq::migrate`].
    ///
    /// # Cancel safety
    ///
    /// As [`Shardq::migrate`].
    pub async fn migrate_within(&self, wait: std::time::Duration) -> Result<(), MigrateError> {
        migrate::migrate_all_within(&self.shards, wait)
            .await
            .map(|_| ())
    }

    /// Checks that every shard is migrated to this version and in its place
    /// in the shard map; workers do this at start.
    ///
    /// # Errors
    ///
    /// [`MigrateError`] naming the shard.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads).
    pub async fn check(&self) -> Result<(), MigrateError> {
        migrate::check_all(&self.shards).await?;
        // Route by the shards' own map from now on (their epochs checked
        // to tile above).
        if let Err(err) = self.shards.load_map().await {
            tracing::warn!(error = %crate::error_chain::error_chain(&err),
                "cannot load the shard map; enqueues load it when they need it");
        }
        Ok(())
    }

    /// A client: enqueue, read, cancel and retry jobs.
    pub fn client(&self) -> Client {
        Client::from_shards(self.shards.clone(), self.config.limits.clone())
    }

    /// A worker for `config.worker.queues` with `handlers`; run it with
    /// [`Worker::run`].
    pub fn worker(&self, handlers: HandlerRegistry) -> Worker {
        Worker::new(self.config.clone(), self.shards.clone(), handlers)
    }

    /// The shards.
    pub fn shards(&self) -> &ShardSet {
        &self.shards
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Closes every pool: later calls fail; in-flight ones finish.
    pub fn close(&self) {
        self.shards.close();
    }
}
