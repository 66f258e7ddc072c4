//! The shard set: one connection pool per configured shard.

use crate::config::{Config, ShardConfig};
use crate::lent::Lent;
pub use crate::lent::PooledClient;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use std::time::Duration;

/// Errors from reaching a shard.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// No connection could be had from the pool (server down, refused, timed out).
    #[error(
        "shard `{shard}`: cannot get a connection ({target}, sslmode {sslmode}); is the server up and the URL right?"
    )]
    Connect {
        /// Shard name.
        shard: String,
        /// host:port/dbname, without password.
        target: String,
        /// The shard's `sslmode`, since TLS failures end up here too.
        sslmode: &'static str,
        /// Cause.
        #[source]
        source: deadpool_postgres::PoolError,
    },
    /// A statement failed.
    #[error("shard `{shard}`: query failed")]
    Query {
        /// Shard name.
        shard: String,
        /// Cause (classify by `code()`, never by message).
        #[source]
        source: tokio_postgres::Error,
    },
    /// A statement got no answer within its deadline (the server hangs, or
    /// the network lost the reply). The statement may still run when the
    /// server answers again; everything shardq runs is safe to repeat.
    #[error("shard `{shard}`: no answer within {after:?} (database.statement_timeout_ms)")]
    Timeout {
        /// Shard name.
        shard: String,
        /// The deadline that passed.
        after: Duration,
    },
    /// The TLS connector could not be built.
    #[error("shard `{shard}`: cannot set up TLS")]
    Tls {
        /// Shard name.
        shard: String,
        /// Cause.
        #[source]
        source: crate::tls::TlsError,
    },
    /// Building the pool failed.
    #[error("shard `{shard}`: cannot build a connection pool")]
    Build {
        /// Shard name.
        shard: String,
        /// Cause.
        #[source]
        source: deadpool_postgres::BuildError,
    },
}

/// One shard: its name and its pool.
#[derive(Clone)]
pub struct Shard {
    /// Position in the configured list (the routing index).
    pub index: usize,
    /// Configured name.
    pub name: String,
    target: String,
    sslmode: &'static str,
    pool: Pool,
    user_pool: Pool,
    deadline: Duration,
    /// Longest cleaning of a connection lent through [`Shard::client`].
    clean_within: Duration,
    behind_pooler: bool,
    /// How to open a connection of its own (for LISTEN), without a pool.
    direct: Option<Direct>,
    /// The (queue, priority) pairs whose ready floors this process knows
    /// exist on this shard (`store::floors`).
    pub(crate) floors_made:
        std::sync::Arc<std::sync::Mutex<std::collections::HashSet<(String, i32)>>>,
}

/// A connection's settings and TLS, for a dedicated connection.
#[derive(Clone)]
struct Direct {
    pg: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
}

/// A dedicated connection listening on a notification channel; dropping it
/// closes the connection.
pub struct Listener {
    _client: tokio_postgres::Client,
    /// The payloads of the notifications, in order; ends when the
    /// connection does.
    pub payloads: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("index", &self.index)
            .field("name", &self.name)
            .field("target", &self.target)
            .field("sslmode", &self.sslmode)
            .finish()
    }
}

impl Shard {
    /// A connection of shardq's own pool. It carries shardq's settings
    /// (index-only plans, `lock_timeout`, `statement_timeout`, and an
    /// `idle_in_transaction_session_timeout` of two statement deadlines), tuned for shardq's statements: for your own, take
    /// [`Shard::user_client`].
    /// Whatever you `SET` on it is cleaned off before the pool lends it again.
    ///
    /// # Errors
    ///
    /// [`ShardError::Connect`] when the server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a pool checkout.
    pub async fn client(&self) -> Result<PooledClient, ShardError> {
        let client = self.get_from(&self.pool).await?;
        Ok(PooledClient::new(client, self.clean_within))
    }

    /// A connection of shardq's pool for one of its own operations, which
    /// leave nothing on the session: it goes back uncleaned once settled,
    /// and is closed when the operation is cut off (see [`crate::lent`]).
    pub(crate) async fn lend(&self) -> Result<Lent, ShardError> {
        Ok(Lent::new(self.get_from(&self.pool).await?))
    }

    /// A connection for your own statements on this shard (a transactional
    /// enqueue, say): the server's settings, none of shardq's, and cleaned of
    /// whatever you `SET` before it is handed out again. Any other
    /// connection of yours to this database does as well.
    ///
    /// # Errors
    ///
    /// [`ShardError::Connect`] when the server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a pool checkout.
    pub async fn user_client(&self) -> Result<deadpool_postgres::Client, ShardError> {
        self.get_from(&self.user_pool).await
    }

    async fn get_from(&self, pool: &Pool) -> Result<deadpool_postgres::Client, ShardError> {
        tracing::debug!(shard = %self.name, target = %self.target, "connection checkout");
        pool.get().await.map_err(|source| ShardError::Connect {
            shard: self.name.clone(),
            target: self.target.clone(),
            sslmode: self.sslmode,
            source,
        })
    }

    /// The client-side deadline of one operation on this shard
    /// ([`Shard::within`]).
    pub(crate) fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Runs `work` (one operation on this shard: a connection and its
    /// statements) within the statement deadline. A server that stops
    /// answering without closing the connection becomes an error here
    /// instead of a hang; the connection it held is closed, not lent again.
    ///
    /// # Errors
    ///
    /// `work`'s error, or [`ShardError::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// As `work`'s: at the deadline `work` is dropped.
    pub async fn within<T, E: From<ShardError>>(
        &self,
        work: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        tokio::time::timeout(self.deadline, work)
            .await
            .unwrap_or_else(|_| {
                Err(ShardError::Timeout {
                    shard: self.name.clone(),
                    after: self.deadline,
                }
                .into())
            })
    }

    /// Closes pooled connections unused for `idle` or longer, so a process
    /// holds on each shard what its load needs, not its peak.
    pub fn release_idle(&self, idle: Duration) {
        for pool in [&self.pool, &self.user_pool] {
            pool.retain(|_, metrics| metrics.last_used() < idle);
        }
    }

    /// Wraps a query error with this shard's name.
    pub fn query_error(&self, source: tokio_postgres::Error) -> ShardError {
        ShardError::Query {
            shard: self.name.clone(),
            source,
        }
    }

    /// Opens a dedicated connection (outside the pools) that listens on
    /// `channel`. `None` behind a transaction pooler, where a session's
    /// `LISTEN` would stay on whichever server connection it was lent.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the server cannot be reached or refuses `LISTEN`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a connection half made is dropped.
    pub async fn listen(&self, channel: &str) -> Result<Option<Listener>, ShardError> {
        let Some(direct) = &self.direct else {
            return Ok(None);
        };
        let query = |e| self.query_error(e);
        let connect = direct.pg.connect(direct.tls.clone());
        let (client, mut connection) = tokio::time::timeout(self.deadline, connect)
            .await
            .map_err(|_| ShardError::Timeout {
                shard: self.name.clone(),
                after: self.deadline,
            })?
            .map_err(query)?;
        let (sender, payloads) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            use futures_util::StreamExt;
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let tokio_postgres::AsyncMessage::Notification(n) = message {
                    if sender.send(n.payload().to_string()).is_err() {
                        return;
                    }
                }
            }
        });
        let listen = format!("LISTEN \"{}\"", channel.replace('"', "\"\""));
        self.within(async { client.batch_execute(&listen).await.map_err(query) })
            .await?;
        Ok(Some(Listener {
            _client: client,
            payloads,
        }))
    }

    /// Whether the shard is reached through a transaction-pooling proxy
    /// (`transaction_pooler = true`): no session state survives a transaction.
    pub fn behind_pooler(&self) -> bool {
        self.behind_pooler
    }

    /// host:port/dbname, for messages.
    pub fn target(&self) -> &str {
        &self.target
    }
}

/// All shards of a configuration, in routing order.
#[derive(Debug, Clone)]
pub struct ShardSet {
    shards: Vec<Shard>,
    /// The map `for_key` routes by, shared by every clone.
    routing: std::sync::Arc<crate::shard_map::RoutingMap>,
}

impl ShardSet {
    /// Builds one pool per shard. Connects lazily: an unreachable shard is an
    /// error only when used.
    ///
    /// # Errors
    ///
    /// [`ShardError::Build`] when a pool cannot be built.
    pub fn connect(config: &Config) -> Result<ShardSet, ShardError> {
        let shards = config
            .shards
            .iter()
            .enumerate()
            .map(|(index, shard)| build_shard(index, shard, config))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ShardSet::of(shards))
    }

    /// Closes every pool: idle connections are dropped now, connections in
    /// use when they come back, and later `client()` calls fail. Call it
    /// before stopping the servers, so no connection sees them go away.
    pub fn close(&self) {
        for shard in &self.shards {
            shard.pool.close();
            shard.user_pool.close();
        }
    }

    /// The shards in routing order.
    pub fn all(&self) -> &[Shard] {
        &self.shards
    }

    /// Shard `index` (panics when out of range: indexes come from the router).
    pub fn get(&self, index: usize) -> &Shard {
        &self.shards[index]
    }

    /// Number of shards.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Whether there are no shards (never true for a validated config).
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// The shard holding `shard_key` by the map routed by now (the
    /// formula's epoch 1 until [`ShardSet::load_map`]).
    pub fn for_key(&self, shard_key: i32) -> &Shard {
        self.get(self.routing.get().shard_for(shard_key))
    }

    /// The shard map routed by now, shared by every clone of this set.
    #[doc(hidden)]
    pub fn routing(&self) -> &crate::shard_map::RoutingMap {
        &self.routing
    }

    fn of(shards: Vec<Shard>) -> ShardSet {
        let routing = crate::shard_map::RoutingMap::formula(shards.len());
        ShardSet {
            shards,
            routing: std::sync::Arc::new(routing),
        }
    }
}

fn build_shard(index: usize, shard: &ShardConfig, config: &Config) -> Result<Shard, ShardError> {
    let mut pg = shard.pg.clone();
    pg.connect_timeout(config.database.connect_timeout);
    crate::session::keep_alive(&mut pg);
    // Your own statements run with the server's settings, not shardq's.
    let user_pool = build_pool(
        shard,
        config,
        pg.clone().application_name("shardq-user"),
        RecyclingMethod::Clean,
    )?;
    pg.application_name("shardq");
    // Custom plans always: with a generic plan the planner does not know the
    // batch size or array lengths, and with a large table of finished rows it
    // chose hash joins over a full scan for every claim and completion.
    //
    // Index-driven plans always: every statement shardq runs per batch is a
    // lookup by primary key or a walk of a partial index, but statistics taken
    // while nothing was running (after a bulk enqueue, say) estimate `owner =
    // $1` at one row, and the planner then scanned every running row, or the
    // whole table, once per completed job (10 s for a batch of 1000 on a
    // 30k-row table, found by `shardq bench scale`; tests/plans.rs). Without
    // seq scans, hash and merge joins it keeps the nested loop over the
    // batch's primary keys.
    //
    // No JIT: a disabled seq scan is costed at 10^10, far above
    // `jit_above_cost`, so every statement that still has to scan a small
    // table (the expiry of `shardq_workers`, say) was compiled by LLVM with
    // inlining and optimization on every call: 30 ms instead of 0.02 on an
    // idle server, and most of four servers' CPU under load (`shardq bench
    // scale`, tests/plans.rs). shardq's statements are short; JIT never pays.
    //
    // READ COMMITTED whatever the database's default: the claims' moves of
    // the ready floors and a grouped job's turn read what has committed by
    // each statement (migrations/functions/shardq_take_turn.sql).
    let mut options = String::from(
        "-c plan_cache_mode=force_custom_plan -c enable_seqscan=off \
         -c enable_hashjoin=off -c enable_mergejoin=off -c jit=off \
         -c default_transaction_isolation=read\\ committed",
    );
    if !config.database.lock_timeout.is_zero() {
        options.push_str(&format!(
            " -c lock_timeout={}",
            config.database.lock_timeout.as_millis()
        ));
    }
    options.push_str(&format!(
        " -c statement_timeout={}",
        config.database.statement_timeout.as_millis()
    ));
    // A frozen or cut-off worker's session must not hold its locks for hours.
    options.push_str(&crate::session::server_options(
        config.database.statement_timeout,
    ));
    // A transaction-pooling proxy refuses session settings at connect time
    // (and would not keep them): behind one, the role's or database's own
    // settings apply (README, "Behind PgBouncer"); deadlines stay client-side.
    if !shard.transaction_pooler {
        pg.options(options);
    }
    let pool = build_pool(shard, config, &pg, RecyclingMethod::Fast)?;
    let direct = if shard.transaction_pooler {
        None
    } else {
        let (pg, tls) = with_tls(shard, &pg)?;
        Some(Direct { pg, tls })
    };
    Ok(Shard {
        index,
        name: shard.name.clone(),
        target: describe(&shard.pg),
        sslmode: shard.tls.name(),
        pool,
        user_pool,
        deadline: client_deadline(config.database.statement_timeout),
        clean_within: config.database.connect_timeout,
        behind_pooler: shard.transaction_pooler,
        direct,
        floors_made: Default::default(),
    })
}

/// The client-side deadline of one operation: a quarter longer than the
/// server's `statement_timeout`, so that a statement the server cancelled
/// reports that (SQLSTATE 57014: it did nothing) before the client gives up
/// not knowing (found by `tests/store.rs`: with equal deadlines the client
/// always fired first).
fn client_deadline(statement_timeout: Duration) -> Duration {
    statement_timeout + statement_timeout / 4
}

/// `pg` with the shard's `sslmode`, and the TLS connector for it. `tls` is
/// the source of truth, also for a hand-built `ShardConfig`.
fn with_tls(
    shard: &ShardConfig,
    pg: &tokio_postgres::Config,
) -> Result<
    (
        tokio_postgres::Config,
        tokio_postgres_rustls::MakeRustlsConnect,
    ),
    ShardError,
> {
    let mut pg = pg.clone();
    pg.ssl_mode(shard.tls.pg_ssl_mode());
    let tls = crate::tls::connector(&shard.tls).map_err(|source| ShardError::Tls {
        shard: shard.name.clone(),
        source,
    })?;
    Ok((pg, tls))
}

/// A pool of connections made with `pg` to `shard`, handed out again as
/// `recycling` says: the user pool cleans each connection before it lends
/// it again (a `SET` made on it does not reach the next user; the cleaning
/// is a round trip, so a connection left stuck by a statement past its
/// deadline fails the recycle deadline and is dropped); shardq's own pool
/// does not, since the connections it lends are cleaned or closed on their
/// way back ([`crate::lent`]).
fn build_pool(
    shard: &ShardConfig,
    config: &Config,
    pg: &tokio_postgres::Config,
    recycling: RecyclingMethod,
) -> Result<Pool, ShardError> {
    let (pg, tls) = with_tls(shard, pg)?;
    let manager = Manager::from_config(
        pg,
        tls,
        ManagerConfig {
            recycling_method: recycling,
        },
    );
    Pool::builder(manager)
        .max_size(shard.pool_size)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(config.database.connect_timeout))
        .recycle_timeout(Some(config.database.connect_timeout))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|source| ShardError::Build {
            shard: shard.name.clone(),
            source,
        })
}

fn describe(pg: &tokio_postgres::Config) -> String {
    let host = match pg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "?".into(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}/{}", pg.get_dbname().unwrap_or("?"))
}

impl ShardSet {
    /// A set holding one shard of another set (its index is kept).
    pub fn single(shard: Shard) -> ShardSet {
        ShardSet::of(vec![shard])
    }
}
