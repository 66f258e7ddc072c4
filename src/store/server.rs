//! Statements about the server rather than a shard's tables.

use super::sql;
use tokio_postgres::error::SqlState;

/// Creates database `name` through `admin` (a connection to another database
/// of the server) unless it exists.
///
/// # Errors
///
/// The statement's error.
///
/// # Cancel safety
///
/// Safe to call again after a drop: an existing database is left as is.
pub async fn create_database(
    admin: &tokio_postgres::Client,
    name: &str,
) -> Result<(), tokio_postgres::Error> {
    if admin
        .query_opt(sql::DATABASE_EXISTS, &[&name])
        .await?
        .is_some()
    {
        return Ok(());
    }
    let create = format!("CREATE DATABASE {}", quote_ident(name));
    match admin.batch_execute(&create).await {
        // Someone else created it since the check.
        Err(e) if e.code() == Some(&SqlState::DUPLICATE_DATABASE) => Ok(()),
        other => other,
    }
}

/// Quotes `name` as an SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    #[test]
    fn identifiers_are_quoted_with_their_quotes_doubled() {
        assert_eq!(super::quote_ident(r#"a"b"#), r#""a""b""#);
    }
}
