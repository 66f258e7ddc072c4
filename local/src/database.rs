//! Databases on a local server: `shardq` on each server `up` starts, and
//! the fresh shards of the tests.

use crate::error::LocalError;
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

/// Whether a database of that name exists (`$1`: the name).
const DATABASE_EXISTS: &str = "SELECT 1 FROM pg_database WHERE datname = $1";

/// Creates database `name` on the server at `admin_url` unless it exists.
///
/// # Errors
///
/// [`LocalError::Postgres`] when the server refuses the connection or the
/// statement.
///
/// # Cancel safety
///
/// Safe to call again after a drop: an existing database is left as is.
pub async fn create_database(admin_url: &str, name: &str) -> Result<(), LocalError> {
    let pg_err = |action: String| move |source| LocalError::Postgres { action, source };
    let (client, connection) = tokio_postgres::connect(admin_url, NoTls)
        .await
        .map_err(pg_err(format!("connect to {admin_url}")))?;
    let connection = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "admin connection ended with an error");
        }
    });
    create_if_absent(&client, name)
        .await
        .map_err(pg_err(format!("create database {name}")))?;
    drop(client);
    let _ = connection.await;
    Ok(())
}

/// `CREATE DATABASE name` unless it exists; one created by someone else
/// between the check and the create counts as created.
async fn create_if_absent(
    admin: &tokio_postgres::Client,
    name: &str,
) -> Result<(), tokio_postgres::Error> {
    if admin.query_opt(DATABASE_EXISTS, &[&name]).await?.is_some() {
        return Ok(());
    }
    // CREATE DATABASE takes no bind parameters: the name is quoted instead.
    let create = format!("CREATE DATABASE {}", quote_ident(name));
    match admin.batch_execute(&create).await {
        Err(e) if e.code() == Some(&SqlState::DUPLICATE_DATABASE) => Ok(()),
        other => other,
    }
}

/// Quotes `name` as an SQL identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
