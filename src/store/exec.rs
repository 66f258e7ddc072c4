//! Running one statement on a shard: a pooled connection, the shard's
//! deadline, typed parameters on the unnamed statement (one round trip, what
//! a transaction pooler needs), and errors that name the shard. Every store
//! operation goes through these.

use super::sql::{self, Param};
use crate::shards::{PooledClient, Shard, ShardError};
use std::future::Future;
use tokio_postgres::types::Type;
use tokio_postgres::Row;

/// Every row of `statement`.
pub(crate) async fn query(
    shard: &Shard,
    statement: &str,
    params: &[Param<'_>],
) -> Result<Vec<Row>, ShardError> {
    shard
        .within(async {
            let mut client = shard.lend().await?;
            let rows = client.query_typed(statement, params).await;
            client.settle();
            rows.map_err(|e| shard.query_error(e))
        })
        .await
}

/// The first row of `statement`, if any.
pub(crate) async fn query_opt(
    shard: &Shard,
    statement: &str,
    params: &[Param<'_>],
) -> Result<Option<Row>, ShardError> {
    Ok(query(shard, statement, params).await?.into_iter().next())
}

/// The one row `statement` always returns.
pub(crate) async fn query_one(
    shard: &Shard,
    statement: &str,
    params: &[Param<'_>],
) -> Result<Row, ShardError> {
    shard
        .within(async {
            let mut client = shard.lend().await?;
            let row = client.query_typed_one(statement, params).await;
            client.settle();
            row.map_err(|e| shard.query_error(e))
        })
        .await
}

/// The one row a read `statement` returns, in a read-only transaction whose
/// statements the server ends after `server_deadline` (`SET LOCAL`: a
/// read abandoned at the shard's deadline here does not run on there).
pub(crate) async fn read_one_within(
    shard: &Shard,
    server_deadline: std::time::Duration,
    statement: &str,
    params: &[Param<'_>],
) -> Result<Row, ShardError> {
    let deadline_ms = server_deadline.as_millis().max(1).to_string();
    shard
        .within(async {
            let mut client = shard.lend().await?;
            let row = async {
                let tx = client.build_transaction().read_only(true).start().await?;
                tx.query_typed(sql::DEADLINE_LOCAL, &[(&deadline_ms, Type::TEXT)])
                    .await?;
                let row = tx.query_typed_one(statement, params).await?;
                tx.commit().await?;
                Ok(row)
            }
            .await;
            client.settle();
            row.map_err(|e| shard.query_error(e))
        })
        .await
}

/// How many rows `statement` changed.
pub(crate) async fn execute(
    shard: &Shard,
    statement: &str,
    params: &[Param<'_>],
) -> Result<u64, ShardError> {
    shard
        .within(async {
            let mut client = shard.lend().await?;
            let changed = client.execute_typed(statement, params).await;
            client.settle();
            changed.map_err(|e| shard.query_error(e))
        })
        .await
}

/// Runs `lock` (a statement that locks rows and reads them), then, when
/// `go_on` says so of its rows, `decide`, in one transaction: `decide` is
/// a statement of its own, so its snapshot sees every commit made before
/// `lock`'s locks were granted. Returns the rows of each (`None` when
/// `decide` did not run).
pub(crate) async fn lock_then(
    shard: &Shard,
    lock: (&str, &[Param<'_>]),
    decide: (&str, &[Param<'_>]),
    go_on: impl FnOnce(&[Row]) -> bool,
) -> Result<(Vec<Row>, Option<Vec<Row>>), ShardError> {
    shard
        .within(async {
            let mut client = shard.lend().await?;
            let rows = async {
                let tx = client.transaction().await?;
                let locked = tx.query_typed(lock.0, lock.1).await?;
                let decided = match go_on(&locked) {
                    true => Some(tx.query_typed(decide.0, decide.1).await?),
                    false => None,
                };
                tx.commit().await?;
                Ok((locked, decided))
            }
            .await;
            client.settle();
            rows.map_err(|e| shard.query_error(e))
        })
        .await
}

/// Runs `statement` in one transaction, between taking the key locks of
/// the jobs (`keys`, `ids`) and releasing the keys it left free (their
/// lowest waiting job is queued). Every change to keyed jobs but the claim
/// goes through here or [`under_key_locks_in`].
pub(crate) async fn under_key_locks(
    shard: &Shard,
    keys: &[i32],
    ids: &[i64],
    statement: &str,
    params: &[Param<'_>],
) -> Result<Vec<Row>, ShardError> {
    shard
        .within(async {
            let err = |e| shard.query_error(e);
            let mut client = shard.lend().await?;
            let rows = async {
                let tx = client.transaction().await?;
                let rows = under_key_locks_in(&tx, keys, ids, statement, params).await?;
                tx.commit().await?;
                Ok(rows)
            }
            .await;
            client.settle();
            rows.map_err(err)
        })
        .await
}

/// [`under_key_locks`] inside the caller's transaction `tx`.
pub(crate) async fn under_key_locks_in(
    tx: &deadpool_postgres::Transaction<'_>,
    keys: &[i32],
    ids: &[i64],
    statement: &str,
    params: &[Param<'_>],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let job_ids: [Param; 2] = [(&keys, Type::INT4_ARRAY), (&ids, Type::INT8_ARRAY)];
    tx.query_typed(sql::KEYS_LOCK, &job_ids).await?;
    let rows = tx.query_typed(statement, params).await?;
    tx.query_typed(sql::KEYS_PROMOTE, &job_ids).await?;
    Ok(rows)
}

/// Runs `work` on a session of the shard's pool ([`Shard::client`]: cleaned
/// before the pool lends it again, so `work` may take session locks or
/// change settings), within the shard's deadline; its statement errors name
/// the shard. For operations that need a session of their own rather than
/// one statement: a move's transactions, its locks.
pub(crate) async fn in_session<T, Fut>(
    shard: &Shard,
    work: impl FnOnce(PooledClient) -> Fut,
) -> Result<T, ShardError>
where
    Fut: Future<Output = Result<T, tokio_postgres::Error>>,
{
    shard
        .within(async {
            let db = shard.client().await?;
            work(db).await.map_err(|e| shard.query_error(e))
        })
        .await
}
