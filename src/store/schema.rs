//! Schema bookkeeping for `migrate`: applied versions, the migration lock,
//! the shard map, and running a migration's own text.
//!
//! Two ways to hold the migration lock: [`MigrationTx`], one transaction
//! holding the transaction-level lock (works through a transaction pooler),
//! and [`MigrationSession`], a session holding the session-level lock while
//! it runs statements that must not be in a transaction (`CREATE INDEX
//! CONCURRENTLY`).
//!
//! Both only *try* the lock, and wait between tries outside any transaction:
//! a concurrent index build waits for every open transaction, so a process
//! waiting for the lock inside one (even the implicit transaction of a
//! blocking `pg_advisory_lock`) would deadlock with the build that holds it
//! (found by `tests/migrate.rs`: four processes migrating at once).

/// Pause between tries of the migration lock.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

use super::{exec, locks, sql};
use crate::shards::{Shard, ShardError};
use tokio_postgres::types::Type;

/// The newest applied migration of `shard`; `None` when it was never
/// migrated.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn current_version(shard: &Shard) -> Result<Option<i32>, ShardError> {
    let present: bool = exec::query_one(shard, sql::MIGRATIONS_TABLE_EXISTS, &[])
        .await?
        .get("present");
    if !present {
        return Ok(None);
    }
    Ok(exec::query_one(shard, sql::MIGRATION_CURRENT, &[])
        .await?
        .get("version"))
}

/// The applied versions of `shard` (none when it was never migrated).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn applied(shard: &Shard) -> Result<Vec<i32>, ShardError> {
    let present: bool = exec::query_one(shard, sql::MIGRATIONS_TABLE_EXISTS, &[])
        .await?
        .get("present");
    if !present {
        return Ok(Vec::new());
    }
    let rows = exec::query(shard, sql::MIGRATIONS_APPLIED, &[]).await?;
    Ok(rows.iter().map(|r| r.get("version")).collect())
}

/// The applied versions, read on `client` (inside a migration's transaction
/// or session).
async fn applied_on(
    shard: &Shard,
    client: &deadpool_postgres::Client,
) -> Result<Vec<i32>, ShardError> {
    let rows = client
        .query(sql::MIGRATIONS_APPLIED, &[])
        .await
        .map_err(|e| shard.query_error(e))?;
    Ok(rows.iter().map(|r| r.get("version")).collect())
}

/// The (shard count, index) `shard` records, when it has a shard map row.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn shard_map(shard: &Shard) -> Result<Option<(i32, i32)>, ShardError> {
    let present: bool = exec::query_one(shard, sql::SHARD_MAP_TABLE_EXISTS, &[])
        .await?
        .get("present");
    if !present {
        return Ok(None);
    }
    let row = exec::query_opt(shard, sql::SHARD_MAP_GET, &[]).await?;
    Ok(row.map(|r| (r.get("shard_count"), r.get("shard_index"))))
}

/// The names, among `functions` (name, file text), whose text differs from
/// the one `shard` last applied (all of them when it records none).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn stale_functions(
    shard: &Shard,
    functions: &[(&str, &str)],
) -> Result<Vec<String>, ShardError> {
    let present: bool = exec::query_one(shard, sql::FUNCTIONS_TABLE_EXISTS, &[])
        .await?
        .get("present");
    if !present {
        return Ok(functions.iter().map(|(name, _)| name.to_string()).collect());
    }
    let (names, texts) = split(functions);
    let rows = exec::query(
        shard,
        sql::FUNCTIONS_STALE,
        &[(&names, Type::TEXT_ARRAY), (&texts, Type::TEXT_ARRAY)],
    )
    .await?;
    Ok(rows.iter().map(|r| r.get("name")).collect())
}

/// The names and the texts of `functions`, as two arrays.
fn split<'f>(functions: &[(&'f str, &'f str)]) -> (Vec<&'f str>, Vec<&'f str>) {
    functions.iter().copied().unzip()
}

/// A transaction holding the migration lock, with the migrations table in
/// place and no statement deadline (a migration may rewrite a big table).
/// Dropped without [`MigrationTx::commit`], its connection is discarded and
/// the server rolls the transaction back.
pub struct MigrationTx<'s> {
    pub(super) shard: &'s Shard,
    pub(super) client: crate::shards::PooledClient,
}

impl<'s> MigrationTx<'s> {
    /// Opens a transaction that holds the lock, trying again (outside a
    /// transaction) until it gets it.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than reused,
    /// so the server rolls the transaction back.
    pub async fn begin(shard: &'s Shard) -> Result<MigrationTx<'s>, ShardError> {
        let client = shard.client().await?;
        let err = |e| shard.query_error(e);
        loop {
            client.batch_execute("BEGIN").await.map_err(err)?;
            let got: bool = client
                .query_one(sql::MIGRATION_TRY_LOCK, &[&locks::MIGRATION])
                .await
                .map_err(err)?
                .get("got");
            if got {
                break;
            }
            client.batch_execute("ROLLBACK").await.map_err(err)?;
            tokio::time::sleep(LOCK_RETRY).await;
        }
        client
            .batch_execute("SET LOCAL statement_timeout = 0")
            .await
            .map_err(err)?;
        client
            .batch_execute(sql::MIGRATIONS_TABLE_CREATE)
            .await
            .map_err(err)?;
        Ok(MigrationTx { shard, client })
    }

    /// The applied versions.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    pub async fn applied(&self) -> Result<Vec<i32>, ShardError> {
        applied_on(self.shard, &self.client).await
    }

    /// Runs a migration's text and records it as applied.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when a statement fails.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than reused,
    /// so the server rolls the transaction back.
    pub async fn apply(&self, version: i32, name: &str, text: &str) -> Result<(), ShardError> {
        let err = |e| self.shard.query_error(e);
        self.client.batch_execute(text).await.map_err(err)?;
        self.client
            .execute(sql::MIGRATION_RECORD, &[&version, &name])
            .await
            .map_err(err)?;
        Ok(())
    }

    /// (Re)creates each of `functions` (name, file text, in the order given)
    /// whose text differs from the one recorded as applied, and records the
    /// new text's hash. Returns the names applied.
    ///
    /// Under the migration lock, no other `migrate` reads or writes the
    /// hashes between the comparison and the record. Workers take no lock
    /// on a function they call: they keep running the old text until this
    /// transaction commits, then the new one, never a mix within one call.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when a statement fails.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than reused,
    /// so the server rolls the transaction back.
    pub async fn apply_functions(
        &self,
        functions: &[(&str, &str)],
    ) -> Result<Vec<String>, ShardError> {
        let err = |e| self.shard.query_error(e);
        self.client
            .batch_execute(sql::FUNCTIONS_TABLE_CREATE)
            .await
            .map_err(err)?;
        let (names, texts) = split(functions);
        let stale: Vec<String> = self
            .client
            .query(sql::FUNCTIONS_STALE, &[&names, &texts])
            .await
            .map_err(err)?
            .iter()
            .map(|r| r.get("name"))
            .collect();
        for (name, text) in functions
            .iter()
            .filter(|(n, _)| stale.iter().any(|s| s == n))
        {
            self.client.batch_execute(text).await.map_err(err)?;
            self.client
                .execute(sql::FUNCTION_RECORD, &[name, text])
                .await
                .map_err(err)?;
        }
        Ok(stale)
    }

    /// The recorded (count, index) of the shard map, if any.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    pub async fn shard_map(&self) -> Result<Option<(i32, i32)>, ShardError> {
        let row = self
            .client
            .query_opt(sql::SHARD_MAP_GET, &[])
            .await
            .map_err(|e| self.shard.query_error(e))?;
        Ok(row.map(|r| (r.get("shard_count"), r.get("shard_index"))))
    }

    /// Records the shard's place in the shard map.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than reused,
    /// so the server rolls the transaction back.
    pub async fn record_shard_map(&self, count: i32, index: i32) -> Result<(), ShardError> {
        self.client
            .execute(sql::SHARD_MAP_RECORD, &[&count, &index])
            .await
            .map_err(|e| self.shard.query_error(e))?;
        Ok(())
    }

    /// Rolls back, releasing the lock.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails (the connection is then
    /// discarded, which ends the transaction too).
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than reused,
    /// so the server rolls the transaction back.
    pub async fn rollback(self) -> Result<(), ShardError> {
        self.client
            .batch_execute("ROLLBACK")
            .await
            .map_err(|e| self.shard.query_error(e))
    }

    /// Commits, releasing the lock.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the commit fails (nothing was applied then).
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than reused,
    /// so the server rolls the transaction back.
    pub async fn commit(self) -> Result<(), ShardError> {
        self.client
            .batch_execute("COMMIT")
            .await
            .map_err(|e| self.shard.query_error(e))
    }
}

/// A session that runs statements outside a transaction, holding the
/// session-level migration lock between [`MigrationSession::lock`] and
/// [`MigrationSession::unlock`]. Its settings are reset when the pool
/// recycles the connection.
pub struct MigrationSession<'c> {
    shard: &'c Shard,
    client: &'c deadpool_postgres::Client,
}

impl<'c> MigrationSession<'c> {
    /// A session on `client`, with the migrations table in place and no
    /// statement deadline.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than reused,
    /// so the server rolls the transaction back.
    pub async fn open(
        shard: &'c Shard,
        client: &'c deadpool_postgres::Client,
    ) -> Result<MigrationSession<'c>, ShardError> {
        let session = MigrationSession { shard, client };
        session.run(sql::MIGRATIONS_TABLE_CREATE).await?;
        session.run("SET statement_timeout = 0").await?;
        Ok(session)
    }

    /// Takes the migration lock, trying again until it gets it.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than reused,
    /// so the server rolls the transaction back.
    pub async fn lock(&self) -> Result<(), ShardError> {
        loop {
            let got: bool = self
                .client
                .query_one(sql::MIGRATION_SESSION_TRY_LOCK, &[&locks::MIGRATION])
                .await
                .map_err(|e| self.shard.query_error(e))?
                .get("got");
            if got {
                return Ok(());
            }
            tokio::time::sleep(LOCK_RETRY).await;
        }
    }

    /// Releases the migration lock.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails (the lock goes with the session).
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than reused,
    /// so the server rolls the transaction back.
    pub async fn unlock(&self) -> Result<(), ShardError> {
        self.client
            .execute(sql::MIGRATION_SESSION_UNLOCK, &[&locks::MIGRATION])
            .await
            .map_err(|e| self.shard.query_error(e))?;
        Ok(())
    }

    /// The applied versions.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    pub async fn applied(&self) -> Result<Vec<i32>, ShardError> {
        applied_on(self.shard, self.client).await
    }

    /// Whether index `name` exists but is invalid (a failed concurrent build).
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    pub async fn index_invalid(&self, name: &str) -> Result<bool, ShardError> {
        let row = self
            .client
            .query_typed(sql::INDEX_INVALID, &[(&name, Type::TEXT)])
            .await
            .map_err(|e| self.shard.query_error(e))?;
        Ok(row.first().is_some_and(|r| r.get::<_, bool>("invalid")))
    }

    /// Drops index `name` concurrently, if it exists.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when it fails.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than reused,
    /// so the server rolls the transaction back.
    pub async fn drop_index(&self, name: &str) -> Result<(), ShardError> {
        self.run(&format!("DROP INDEX CONCURRENTLY IF EXISTS {name}"))
            .await
    }

    /// Runs one statement of a migration on its own.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when it fails.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than reused,
    /// so the server rolls the transaction back.
    pub async fn run(&self, statement: &str) -> Result<(), ShardError> {
        self.client
            .batch_execute(statement)
            .await
            .map_err(|e| self.shard.query_error(e))
    }

    /// Records a migration as applied.
    ///
    /// # Errors
    ///
    /// [`ShardError`] when the shard fails.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-statement, the connection is discarded rather than reused,
    /// so the server rolls the transaction back.
    pub async fn record(&self, version: i32, name: &str) -> Result<(), ShardError> {
        self.client
            .execute(sql::MIGRATION_RECORD, &[&version, &name])
            .await
            .map_err(|e| self.shard.query_error(e))?;
        Ok(())
    }
}
